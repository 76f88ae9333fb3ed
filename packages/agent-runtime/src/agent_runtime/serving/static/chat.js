// The web chat page: sends the conversation to POST /v1/chat/completions (agent mode, stream: true), reads the
// server-sent events and shows, as they arrive, each tool call with its arguments, each tool result, each
// compaction (the chunks' `agent_event` field) and the assistant's answer (the chunks' content deltas).
// When the served model takes images (/health's `images.accepted`), images can be attached (the button, a paste
// or a drop): each is read as a data URL, shown as a thumbnail and sent as an `image_url` part; images a tool
// returned (a tool result's `images`) are shown under its result. Plain JavaScript, no build step; text is always
// inserted as text, never as HTML, and only data:image URLs are ever put into an <img>.
"use strict";

(() => {
  const log = document.getElementById("log");
  const form = document.getElementById("composer");
  const input = document.getElementById("input");
  const sendButton = document.getElementById("send");
  const modelLabel = document.getElementById("model");
  const keyInput = document.getElementById("api-key");
  const showReasoning = document.getElementById("show-reasoning");
  const attachButton = document.getElementById("attach");
  const imageInput = document.getElementById("image-input");
  const attachmentsBox = document.getElementById("attachments");
  const KEY_STORAGE = "openrlhf-agent-api-key";
  const IMAGE_URL = /^data:image\/(png|jpeg|gif|webp|bmp);base64,[A-Za-z0-9+/=\s]*$/i;

  let model = null;
  let history = [];
  let imagesAccepted = false;
  let maxImageBytes = Infinity;
  let attachments = []; // data URLs of the images the next message carries

  keyInput.value = localStorage.getItem(KEY_STORAGE) || "";
  keyInput.addEventListener("change", () => localStorage.setItem(KEY_STORAGE, keyInput.value));
  showReasoning.addEventListener("change", () => log.classList.toggle("hidden-reasoning", !showReasoning.checked));
  document.getElementById("clear").addEventListener("click", () => {
    history = [];
    attachments = [];
    showAttachments();
    log.replaceChildren();
  });

  function add(className, text) {
    const element = document.createElement("div");
    element.className = className;
    if (text !== undefined) element.textContent = text;
    log.appendChild(element);
    element.scrollIntoView({ block: "end" });
    return element;
  }

  function card(kind, label, body) {
    const element = add(`event ${kind}`);
    const title = document.createElement("span");
    title.className = "label";
    title.textContent = label;
    const content = document.createElement("pre");
    content.textContent = body;
    element.append(title, content);
    return element;
  }

  // Thumbnails of images; a URL that is not an inline image is left out, never put into the page.
  function thumbs(urls) {
    const box = document.createElement("div");
    box.className = "thumbs";
    for (const url of urls) {
      if (typeof url !== "string" || !IMAGE_URL.test(url)) continue;
      const image = document.createElement("img");
      image.className = "thumb";
      image.alt = "image";
      image.src = url;
      box.appendChild(image);
    }
    return box;
  }

  function showAttachments() {
    const figures = attachments.map((url, index) => {
      const figure = document.createElement("figure");
      const remove = document.createElement("button");
      remove.type = "button";
      remove.textContent = "×";
      remove.title = "remove this image";
      remove.addEventListener("click", () => {
        attachments.splice(index, 1);
        showAttachments();
      });
      figure.append(thumbs([url]), remove);
      return figure;
    });
    attachmentsBox.replaceChildren(...figures);
    attachmentsBox.hidden = attachments.length === 0;
  }

  function attach(file) {
    if (!imagesAccepted || !file) return;
    if (!/^image\/(png|jpeg|gif|webp|bmp)$/.test(file.type)) {
      card("error", "error", `${file.name || "that file"} is not a PNG, JPEG, GIF, WebP or BMP image`);
      return;
    }
    if (file.size > maxImageBytes) {
      card("error", "error", `${file.name || "the image"} is ${file.size} bytes; the server takes at most ${maxImageBytes}`);
      return;
    }
    const reader = new FileReader();
    reader.addEventListener("load", () => {
      attachments.push(reader.result);
      showAttachments();
    });
    reader.readAsDataURL(file);
  }

  imageInput.addEventListener("change", () => {
    for (const file of imageInput.files) attach(file);
    imageInput.value = "";
  });
  input.addEventListener("paste", (event) => {
    const files = [...(event.clipboardData ? event.clipboardData.files : [])].filter((f) => f.type.startsWith("image/"));
    if (!imagesAccepted || !files.length) return;
    event.preventDefault();
    files.forEach(attach);
  });
  form.addEventListener("dragover", (event) => {
    if (!imagesAccepted) return;
    event.preventDefault();
    form.classList.add("dragging");
  });
  form.addEventListener("dragleave", () => form.classList.remove("dragging"));
  form.addEventListener("drop", (event) => {
    form.classList.remove("dragging");
    if (!imagesAccepted) return;
    event.preventDefault();
    [...event.dataTransfer.files].forEach(attach);
  });

  async function loadInfo() {
    try {
      const response = await fetch("/health");
      const info = await response.json();
      model = info.model;
      const tools = info.tools && info.tools.length ? ` · tools: ${info.tools.join(", ")}` : "";
      modelLabel.textContent = `${info.model} (recipe ${info.recipe}, engine ${info.engine})${tools}`;
      imagesAccepted = Boolean(info.images && info.images.accepted);
      maxImageBytes = (info.images && info.images.max_image_bytes) || Infinity;
      attachButton.hidden = !imagesAccepted;
      document.getElementById("viewer-link").hidden = !info.viewer; // the trajectory viewer (viewer.js)
    } catch (error) {
      modelLabel.textContent = `cannot reach the server: ${error}`;
    }
  }

  // One runtime event (agent_runtime.events, as event_to_dict gives it).
  function showEvent(event, state) {
    switch (event.type) {
      case "assistant":
        if (event.reasoning_content) card("reasoning", "thinking", event.reasoning_content.trim());
        state.pending = event; // its text is shown if tool calls follow; a final turn's text is the answer
        break;
      case "tool_call": {
        if (state.pending && state.pending.turn === event.turn && state.pending.content.trim()) {
          card("said", "assistant", state.pending.content.trim());
        }
        state.pending = null;
        const call = event.call;
        const element = card("tool-call", `tool call: ${call.name}`, JSON.stringify(call.arguments || {}, null, 1));
        if (call.error) element.classList.add("failed");
        break;
      }
      case "tool_result": {
        const element = card("tool-result", `result of ${event.name || "the turn"}`, event.content);
        if (!event.ok) element.classList.add("failed");
        if (Array.isArray(event.images) && event.images.length) {
          element.appendChild(thumbs(event.images.map((part) => part && part.image_url && part.image_url.url)));
        }
        break;
      }
      case "compaction":
        card(
          "compaction",
          `context compacted (segment ${event.segment})`,
          event.summary || "the context policy rewrote the context (no summary)",
        );
        break;
      default:
        break; // "final": the answer arrives as content; "error": the stream's error frame follows
    }
  }

  function* frames(state, text) {
    state.buffer += text;
    let end;
    while ((end = state.buffer.indexOf("\n\n")) >= 0) {
      const frame = state.buffer.slice(0, end);
      state.buffer = state.buffer.slice(end + 2);
      const data = frame
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (data) yield data;
    }
  }

  // A message with images is sent as OpenAI content parts: the images, then the text.
  async function send(text, images) {
    const parts = images.map((url) => ({ type: "image_url", image_url: { url } }));
    if (text) parts.push({ type: "text", text });
    history.push({ role: "user", content: images.length ? parts : text });
    const bubble = add("msg user", text);
    if (images.length) bubble.appendChild(thumbs(images));
    const headers = { "Content-Type": "application/json" };
    if (keyInput.value) headers.Authorization = `Bearer ${keyInput.value}`;
    const state = { buffer: "", pending: null, answer: "", reasoning: "", bubble: null, failed: false };
    let response;
    try {
      response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers,
        body: JSON.stringify({ model, messages: history, stream: true, stream_options: { include_usage: true } }),
      });
    } catch (error) {
      card("error", "error", `request failed: ${error}`);
      history.pop();
      return;
    }
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      card("error", `error ${response.status}`, (body && body.error && body.error.message) || response.statusText);
      history.pop();
      return;
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      for (const data of frames(state, decoder.decode(value, { stream: true }))) {
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) {
          state.failed = true;
          card("error", "error", chunk.error.message);
          continue;
        }
        if (chunk.agent_event) showEvent(chunk.agent_event, state);
        for (const choice of chunk.choices || []) {
          const delta = choice.delta || {};
          if (delta.content) {
            state.answer += delta.content;
            state.bubble = state.bubble || add("msg assistant");
            state.bubble.textContent = state.answer;
          }
        }
        if (chunk.usage) {
          const u = chunk.usage;
          add("muted usage", `${u.prompt_tokens} prompt + ${u.completion_tokens} completion tokens`);
        }
      }
    }
    if (state.failed) history.pop();
    else history.push({ role: "assistant", content: state.answer });
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text && !attachments.length) return;
    const images = attachments;
    input.value = "";
    attachments = [];
    showAttachments();
    sendButton.disabled = true;
    try {
      await send(text, images);
    } finally {
      sendButton.disabled = false;
      input.focus();
    }
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  loadInfo();
})();
