// The web chat page: sends the conversation to POST /v1/chat/completions (agent mode, stream: true), reads the
// server-sent events and shows, as they arrive, each tool call with its arguments, each tool result, each
// compaction (the chunks' `agent_event` field) and the assistant's answer (the chunks' content deltas).
// Plain JavaScript, no build step; text is always inserted as text, never as HTML.
"use strict";

(() => {
  const log = document.getElementById("log");
  const form = document.getElementById("composer");
  const input = document.getElementById("input");
  const sendButton = document.getElementById("send");
  const modelLabel = document.getElementById("model");
  const keyInput = document.getElementById("api-key");
  const showReasoning = document.getElementById("show-reasoning");
  const KEY_STORAGE = "openrlhf-agent-api-key";

  let model = null;
  let history = [];

  keyInput.value = localStorage.getItem(KEY_STORAGE) || "";
  keyInput.addEventListener("change", () => localStorage.setItem(KEY_STORAGE, keyInput.value));
  showReasoning.addEventListener("change", () => log.classList.toggle("hidden-reasoning", !showReasoning.checked));
  document.getElementById("clear").addEventListener("click", () => {
    history = [];
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

  async function loadInfo() {
    try {
      const response = await fetch("/health");
      const info = await response.json();
      model = info.model;
      const tools = info.tools && info.tools.length ? ` · tools: ${info.tools.join(", ")}` : "";
      modelLabel.textContent = `${info.model} (recipe ${info.recipe}, engine ${info.engine})${tools}`;
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
        break;
      }
      case "compaction":
        card("compaction", `context compacted (segment ${event.segment})`, event.summary);
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

  async function send(text) {
    history.push({ role: "user", content: text });
    add("msg user", text);
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
    if (!text) return;
    input.value = "";
    sendButton.disabled = true;
    try {
      await send(text);
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
