// The trajectory viewer: lists the records of GET /trajectories a page at a time (scrolling to the end, or
// "load more", fetches the next page from `next_offset`; the filters start over) and draws one record from
// GET /trajectories/{id} in a pane: the reward breakdown, the errors, the messages (tool calls with their
// results and images), then every segment's tokens, each a <span class="tok trained|context"> after its loss
// mask (data-id, data-mask, data-logprob and, where tracked, data-version on it; hovering shows them), each action
// span's policy version as a "vN" badge before its first token, the summary turn of a compacted segment
// marked, and a boundary between segments naming the summary the next one starts from. "compare" opens a record
// in the second pane, beside the first (the same task under another checkpoint: "same task" filters the list).
// Plain JavaScript, no build step; text is always inserted as text, never as HTML, and only data:image URLs are
// ever put into an <img>.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const list = $("list");
  const moreButton = $("more");
  const statusLine = $("status");
  const malformedBox = $("malformed");
  const hoverInfo = $("hover-info");
  const keyInput = $("api-key");
  const fileSelect = $("file");
  const KEY_STORAGE = "openrlhf-agent-api-key";
  const IMAGE_URL = /^data:image\/(png|jpeg|gif|webp|bmp);base64,[A-Za-z0-9+/=\s]*$/i;
  const PAGE_SIZE = Number(new URLSearchParams(location.search).get("page_size")) || 50;

  let nextOffset = 0;
  let done = false;
  let loading = false;
  let shown = 0;
  let taskKey = null;
  let generation = 0; // bumped when the filters change, so a page fetched for old filters is dropped
  const stopReasons = new Set();
  const errorCodes = new Set(["none"]);

  keyInput.value = localStorage.getItem(KEY_STORAGE) || "";
  keyInput.addEventListener("change", () => localStorage.setItem(KEY_STORAGE, keyInput.value));

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  async function getJSON(url) {
    const headers = keyInput.value ? { Authorization: `Bearer ${keyInput.value}` } : {};
    const response = await fetch(url, { headers });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error ? body.error.message : `HTTP ${response.status}`);
    return body;
  }

  function query(offset) {
    const params = new URLSearchParams({ offset: String(offset), limit: String(PAGE_SIZE) });
    const fields = { min_reward: $("min-reward").value, max_reward: $("max-reward").value,
      stop_reason: $("stop-reason").value.trim(), error_code: $("error-code").value.trim(), file: fileSelect.value };
    for (const [name, value] of Object.entries(fields)) if (value !== "") params.set(name, value);
    if (taskKey) params.set("task_key", taskKey);
    return `/trajectories?${params}`;
  }

  function fillOptions(datalist, values) {
    datalist.replaceChildren(...[...values].sort().map((value) => Object.assign(element("option"), { value })));
  }

  function showFiles(files) {
    const chosen = fileSelect.value;
    const options = [Object.assign(element("option", null, "all"), { value: "" })];
    for (const file of files) {
      const label = file.foreign ? `${file.name} (not trajectories)` : `${file.name} (${file.records})`;
      options.push(Object.assign(element("option", null, label), { value: String(file.number) }));
    }
    fileSelect.replaceChildren(...options);
    fileSelect.value = chosen;
  }

  // "file:line", and the checkpoint or step the record's task names, if any: "steps/a.jsonl:3 (step 10)"
  function where(item) {
    const extra = item.checkpoint.startsWith(item.file) ? item.checkpoint.slice(item.file.length).trim() : "";
    return `${item.file}:${item.line}${extra ? ` (${extra})` : ""}`;
  }

  function listItem(item) {
    const row = element("li");
    row.dataset.id = item.id;
    row.dataset.taskKey = item.task_key;
    row.append(element("div", "task", item.task || "(no task)"));
    const meta = element("div", "meta");
    meta.append(`reward ${item.reward} · ${item.stop_reason || "no stop reason"} · ${where(item)}`);
    if (item.compactions) meta.append(` · ${item.compactions} compaction(s)`);
    if (item.error_codes.length) meta.append(" · ", element("span", "failed", item.error_codes.join(", ")));
    const compare = element("button", "compare", "compare");
    compare.type = "button";
    compare.title = "open beside the trajectory shown";
    compare.addEventListener("click", (event) => { event.stopPropagation(); openRecord(item.id, $("right")); });
    const same = element("button", "same-task", "same task");
    same.type = "button";
    same.title = "list only this task's trajectories (every file, every checkpoint)";
    same.addEventListener("click", (event) => { event.stopPropagation(); setTask(item.task_key); });
    meta.append(" ", compare, " ", same);
    row.append(meta);
    row.addEventListener("click", () => openRecord(item.id, $("left")));
    if (item.stop_reason) stopReasons.add(item.stop_reason);
    item.error_codes.forEach((code) => errorCodes.add(code));
    return row;
  }

  async function loadMore() {
    if (loading || done) return;
    loading = true;
    const mine = generation;
    try {
      const page = await getJSON(query(nextOffset));
      if (mine !== generation) return;
      page.items.forEach((item) => list.appendChild(listItem(item)));
      shown += page.items.length;
      nextOffset = page.next_offset;
      done = page.done;
      showFiles(page.files);
      fillOptions($("stop-reasons"), stopReasons);
      fillOptions($("error-codes"), errorCodes);
      const more = done ? "all scanned" : `${page.indexed} indexed so far`;
      statusLine.textContent = `${shown} trajectories shown (${more})`;
      malformedBox.hidden = page.malformed === 0;
      const lines = page.malformed_lines.map((at) => `${at.file}:${at.line}`).join(", ");
      malformedBox.textContent = `${page.malformed} malformed line(s) skipped: ${lines}`;
      moreButton.hidden = done;
    } catch (error) {
      statusLine.textContent = `cannot list the trajectories: ${error.message}`;
    } finally {
      loading = false;
    }
    // the list still ends on screen (a filter that keeps few records): fetch on
    if (!done && mine === generation && moreButton.getBoundingClientRect().top < window.innerHeight) loadMore();
  }

  function restart() {
    generation += 1;
    loading = false;
    nextOffset = 0;
    done = false;
    shown = 0;
    list.replaceChildren();
    loadMore();
  }

  function setTask(key) {
    taskKey = key;
    $("task-filter").hidden = !key;
    $("task-key").textContent = key || "";
    restart();
  }

  // ---- one record ----

  function imageElement(image) {
    if (image.src && IMAGE_URL.test(image.src)) {
      const img = element("img", "thumb");
      img.src = image.src;
      return img;
    }
    return element("span", "muted", `[image not shown: ${image.name || "not an inline image"}]`);
  }

  function breakdownTable(breakdown, reward) {
    const table = element("table", "breakdown");
    const row = (...cells) => {
      const tr = element("tr");
      cells.forEach((cell) => tr.append(element("td", null, cell)));
      table.append(tr);
    };
    row("total", breakdown ? breakdown.total : reward);
    if (!breakdown) return table;
    for (const kind of ["result", "process"]) {
      for (const [name, value] of Object.entries(breakdown[kind] || {})) {
        const weight = (breakdown.weights || {})[name];
        row(`${kind}: ${name}`, weight === undefined ? value : `${value} × weight ${weight}`);
      }
    }
    for (const [name, code] of Object.entries(breakdown.codes || {})) row(`code: ${name}`, code);
    (breakdown.steps || []).forEach((step, i) => row(`step ${i + 1}`, `${step.total} ${JSON.stringify(step.scores || {})}`));
    return table;
  }

  function messageElement(message) {
    const box = element("div", `message ${message.role}`);
    box.append(element("span", "role", message.role));
    if (message.name) box.append(element("span", "muted", `${message.name} `));
    if (message.reasoning_content) box.append(element("div", "muted", message.reasoning_content));
    if (message.content) box.append(element("span", "content", message.content));
    for (const call of message.tool_calls || []) {
      box.append(element("div", "tool-call", `→ ${call.name}(${JSON.stringify(call.arguments)})${call.error ? " [unparsed]" : ""}`));
    }
    (message.images || []).forEach((image) => box.append(imageElement(image)));
    return box;
  }

  function describe(span) {
    const piece = span.dataset.piece !== undefined ? JSON.stringify(span.dataset.piece) : "(no tokenizer)";
    const logprob = span.dataset.logprob === "" ? "not sampled" : span.dataset.logprob;
    const mask = span.dataset.mask === "1" ? "trained" : "context";
    const summary = span.classList.contains("summary") ? " · summary turn" : "";
    const version = span.dataset.version !== undefined ? ` · policy version ${span.dataset.version}` : "";
    return `token ${span.dataset.index} · id ${span.dataset.id} · piece ${piece} · logprob ${logprob} · ${mask}${summary}`
      + version;
  }

  // Each token's policy version (its action span's; absent where the engine tracked none), and the action spans
  // that carry one by their first token: a generation split by a weight update is two spans, two versions.
  function versionsOf(segment) {
    const versions = new Map();
    const starts = new Map();
    segment.spans.forEach((s) => {
      if (s.kind !== "action" || s.version === undefined || s.version === null) return;
      starts.set(s.start, s);
      for (let i = s.start; i < s.end; i += 1) versions.set(i, s.version);
    });
    return { versions, starts };
  }

  function tokensElement(segment) {
    const box = element("div", "tokens");
    const images = new Map(segment.images.map((image) => [image.start, image]));
    const [summaryStart, summaryEnd] = segment.summary_range || [-1, -1];
    const { versions, starts } = versionsOf(segment);
    const fragment = document.createDocumentFragment();
    for (let i = 0; i < segment.ids.length; i += 1) {
      const versioned = starts.get(i);
      if (versioned) { // a badge before the span's first token: the version its tokens were sampled with
        const badge = element("span", "version", `v${versioned.version}`);
        badge.dataset.version = String(versioned.version);
        badge.title = `policy version ${versioned.version}: tokens ${versioned.start}-${versioned.end}`;
        fragment.append(badge);
      }
      const image = images.get(i);
      if (image && image.end > i) { // the image's pads, drawn as the image
        const span = element("span", `tok image ${segment.loss_mask[i] ? "trained" : "context"}`);
        span.dataset.start = String(image.start);
        span.dataset.end = String(image.end);
        span.title = `image: tokens ${image.start}-${image.end} (${image.end - image.start} pads)`;
        span.append(imageElement(image), element("span", "muted", `${image.end - image.start} pads`));
        fragment.append(span);
        i = image.end - 1;
        continue;
      }
      const mask = segment.loss_mask[i];
      const piece = segment.pieces ? segment.pieces[i] : null;
      const span = element("span", `tok ${mask ? "trained" : "context"}`, piece !== null ? piece : `⟨${segment.ids[i]}⟩`);
      if (i >= summaryStart && i < summaryEnd) span.classList.add("summary");
      span.dataset.index = String(i);
      span.dataset.id = String(segment.ids[i]);
      span.dataset.mask = String(mask);
      const logprob = segment.logprobs[i];
      span.dataset.logprob = logprob === null || logprob === undefined ? "" : String(logprob);
      if (piece !== null) span.dataset.piece = piece;
      if (versions.has(i)) span.dataset.version = String(versions.get(i));
      fragment.append(span);
    }
    box.append(fragment);
    box.addEventListener("mouseover", (event) => {
      const span = event.target.closest(".tok");
      if (span && span.dataset.id !== undefined) {
        hoverInfo.textContent = describe(span);
        span.title = hoverInfo.textContent;
      }
    });
    return box;
  }

  function draw(pane, record) {
    const s = record.summary;
    pane.hidden = false;
    pane.dataset.id = s.id;
    pane.replaceChildren();
    pane.append(element("h2", null, `${where(s)} · episode ${record.episode_id}`));
    pane.append(element("div", "muted", `task: ${s.task || "(none)"}`));
    const facts = `reward ${record.reward} · stop ${record.stop_reason || "none"} · ${record.turns} turn(s) · `
      + `${record.tool_calls} tool call(s) · ${record.compactions} compaction(s) · `
      + `${record.usage.prompt_tokens} context + ${record.usage.completion_tokens} trained tokens`;
    pane.append(element("div", "facts", facts));
    const sampledBy = record.policy_versions || [];
    if (sampledBy.length) { // an engine that tracks policy versions (older records have none)
      const staleness = record.staleness === null || record.staleness === undefined ? "unknown" : record.staleness;
      const now = record.policy_version === null || record.policy_version === undefined ? "unknown" : record.policy_version;
      pane.append(element("div", "versions",
        `policy versions ${sampledBy.join(", ")} · current ${now} · staleness ${staleness}`));
    }
    if (record.final_answer !== null) pane.append(element("div", "answer", `answer: ${record.final_answer}`));
    pane.append(element("h3", null, "reward"), breakdownTable(record.breakdown, record.reward));
    if (record.errors.length) {
      const errors = element("ul", "errors");
      record.errors.forEach((e) => errors.append(element("li", "error", `${e.code} (turn ${e.turn}): ${e.message}`)));
      pane.append(element("h3", null, "errors"), errors);
    }
    pane.append(element("h3", null, "messages"));
    const messages = element("div", "messages");
    record.messages.forEach((message) => messages.append(messageElement(message)));
    pane.append(messages);
    pane.append(element("h3", "tokens-heading", "tokens"));
    const legend = element("div", "legend");
    legend.append(element("span", "tok trained", "trained (loss mask 1)"), element("span", "tok context", "context (0)"),
      element("span", "tok summary", "summary turn"), element("span", "version", "vN: policy version"));
    pane.append(legend);
    record.segments.forEach((segment, index) => {
      if (index > 0) {
        const boundary = element("div", `segment-boundary${segment.summary ? " compaction" : ""}`);
        boundary.textContent = segment.summary
          ? `compaction: segment ${index} starts from the summary “${segment.summary}”`
          : `segment ${index} starts: a new context (the context policy rewrote the messages)`;
        pane.append(boundary);
      }
      const box = element("div", "segment");
      box.dataset.segment = String(index);
      const trained = segment.loss_mask.reduce((a, b) => a + b, 0);
      box.append(element("div", "muted", `segment ${index}: ${segment.ids.length} tokens, ${trained} trained`));
      box.append(tokensElement(segment));
      pane.append(box);
    });
  }

  async function openRecord(id, pane) {
    if (pane.id === "left") {
      list.querySelectorAll("li.open").forEach((row) => row.classList.remove("open"));
      const row = list.querySelector(`li[data-id="${CSS.escape(id)}"]`);
      if (row) row.classList.add("open");
    }
    pane.hidden = false;
    pane.replaceChildren(element("p", "muted", "loading…"));
    try {
      draw(pane, await getJSON(`/trajectories/${encodeURIComponent(id)}`));
    } catch (error) {
      pane.replaceChildren(element("p", "warning", `cannot open ${id}: ${error.message}`));
    }
  }

  async function loadInfo() {
    try {
      const info = await getJSON("/health");
      $("source").textContent = info.model ? `served model ${info.model} · its trajectory log` : `files: ${info.trajectories}`;
      $("chat-link").hidden = !info.model;
    } catch (error) {
      $("source").textContent = `cannot reach the server: ${error.message}`;
    }
  }

  $("filters").addEventListener("submit", (event) => { event.preventDefault(); restart(); });
  fileSelect.addEventListener("change", restart);
  $("clear-task").addEventListener("click", () => setTask(null));
  moreButton.addEventListener("click", loadMore);
  new IntersectionObserver((entries) => {
    if (entries.some((entry) => entry.isIntersecting)) loadMore();
  }, { root: $("sidebar") }).observe(moreButton);
  loadInfo();
  loadMore();
})();
