// perdure inspector: a dependency-free page over the JSON API of `perdure serve`.
// Every piece of stored data is put in the page with textContent, never as HTML.
"use strict";

const PAGE = 50;
const main = () => document.getElementById("main");

// ---------------------------------------------------------------- helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function show(...nodes) {
  main().replaceChildren(...nodes.filter((node) => node !== null && node !== undefined && node !== false));
}

function status(text) {
  document.getElementById("status").textContent = text || "";
}

function when(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  return isNaN(date) ? iso : date.toLocaleString();
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function authHeaders() {
  const token = sessionStorage.getItem("perdure-token");
  return token ? { Authorization: "Bearer " + token } : {};
}

async function api(method, path, body, { raw = false } = {}) {
  const headers = authHeaders();
  let payload;
  if (method !== "GET") {
    headers["Content-Type"] = "application/json";
    payload = body === undefined ? "{}" : typeof body === "string" ? body : JSON.stringify(body);
  }
  const response = await fetch(path, { method, headers, body: payload });
  if (response.status === 401) {
    const token = window.prompt("This server needs a token (perdure serve --token):");
    if (token) {
      sessionStorage.setItem("perdure-token", token);
      return api(method, path, body, { raw });
    }
  }
  if (!response.ok) {
    let code = "http_" + response.status;
    let message = response.statusText;
    try {
      const error = (await response.json()).error;
      code = error.code;
      message = error.message;
    } catch (_) { /* not our error body */ }
    throw new ApiError(response.status, code, message);
  }
  return raw ? response : response.json();
}

function failure(error) {
  const text = error instanceof ApiError ? `${error.message} [${error.code}]` : String(error);
  return el("div", { class: "notice bad", role: "alert", text });
}

function q(path, params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, value);
  }
  const text = search.toString();
  return text ? `${path}?${text}` : path;
}

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: new URLSearchParams(query || "") };
}

function go(path, params) {
  location.hash = q(path, params || {});
}

// ----------------------------------------------------------- session list

async function sessionList(params) {
  const order = params.get("order") || "id";
  const filter = params.get("q") || "";
  const offset = Number(params.get("offset") || 0);
  const after = params.get("after") || "";
  const trail = (params.get("trail") || "").split(",").filter(Boolean); // earlier `after`s
  const byCursor = order === "id" && !filter;
  status("loading sessions…");
  let page;
  try {
    page = await api("GET", q("/api/sessions", byCursor
      ? { limit: PAGE, after }
      : { limit: PAGE, order, q: filter, offset }));
  } catch (error) {
    show(el("h1", { text: "Sessions" }), failure(error));
    status("");
    return;
  }
  status("");
  const search = el("input", { type: "search", id: "filter", placeholder: "filter by id", value: filter });
  search.addEventListener("keydown", (event) => {
    if (event.key === "Enter") go("/", { order, q: search.value });
  });
  const sortButton = el("button", {
    id: "sort-updated",
    title: "sort by update time, newest first",
    onclick: () => go("/", { order: order === "updated" ? "id" : "updated", q: filter }),
  }, order === "updated" ? "Updated ▼" : "Updated");
  const rows = page.sessions.map((s) => el("tr", { class: s.damaged ? "bad" : "" },
    el("td", {}, el("a", { href: "#/s/" + encodeURIComponent(s.session_id), class: "session-link" }, s.session_id)),
    el("td", { text: when(s.created_at) }),
    el("td", { text: when(s.updated_at) }),
    el("td", { class: "num", text: s.damaged ? "damaged" : String(s.message_count) }),
    el("td", { class: "num", text: s.expires_in == null ? "–" : `${Math.round(s.expires_in)} s` })));
  const pager = el("div", { class: "toolbar pager" });
  let where = "";
  if (byCursor) {
    if (trail.length || after) {
      pager.append(el("button", {
        id: "prev-page",
        onclick: () => {
          const previous = trail.slice(0, -1);
          go("/", { after: trail[trail.length - 1] || "", trail: previous.join(",") });
        },
      }, "← Previous"));
    }
    if (page.next_after) {
      pager.append(el("button", {
        id: "next-page",
        onclick: () => go("/", { after: page.next_after, trail: [...trail, after].join(",") }),
      }, "Next →"));
    }
  } else {
    where = page.total ? `${offset + 1}–${offset + page.sessions.length} of ${page.total}, as of ${when(page.as_of)}` : "";
    if (offset > 0) pager.append(el("button", { id: "prev-page", onclick: () => go("/", { order, q: filter, offset: Math.max(0, offset - PAGE) }) }, "← Previous"));
    if (page.next_offset !== null) pager.append(el("button", { id: "next-page", onclick: () => go("/", { order, q: filter, offset: page.next_offset }) }, "Next →"));
  }
  pager.append(el("span", { class: "muted", text: where }));
  show(
    el("h1", { text: "Sessions" }),
    el("div", { class: "toolbar" }, search,
      el("button", { onclick: () => go("/", { order, q: search.value }) }, "Filter"),
      filter ? el("button", { onclick: () => go("/", { order }) }, "Clear") : null),
    page.sessions.length
      ? el("table", { id: "sessions" },
        el("thead", {}, el("tr", {},
          el("th", { text: "Session" }), el("th", { text: "Created" }), el("th", {}, sortButton),
          el("th", { class: "num", text: "Messages" }), el("th", { class: "num", text: "Expires in" }))),
        el("tbody", {}, rows))
      : el("p", { class: "muted", text: filter ? `No session id contains “${filter}”.` : "No sessions." }),
    pager,
  );
}

// ----------------------------------------------------------- session view

function imageSource(block) {
  const source = block.image && block.image.source;
  const bytes = source && source.bytes;
  if (bytes && bytes.__bytes_encoded__ && typeof bytes.data === "string") {
    const format = /^[a-z0-9]+$/.test(block.image.format || "") ? block.image.format : "png";
    return `data:image/${format};base64,${bytes.data}`;
  }
  return null;
}

function pretty(value) {
  try { return JSON.stringify(value, null, 2); } catch (_) { return String(value); }
}

function resultText(result) {
  return (result.content || []).map((part) => {
    if (typeof part.text === "string") return part.text;
    if (part.json !== undefined) return pretty(part.json);
    if (part.image) return "[image]";
    return pretty(part);
  }).join("\n");
}

function renderBlock(block, results) {
  if (typeof block.text === "string") return el("div", { class: "text", text: block.text });
  if (block.image) {
    const src = imageSource(block);
    return src ? el("img", { src, alt: `image (${block.image.format || "?"})`, class: "msg-image" })
      : el("div", { class: "muted", text: "[image]" });
  }
  if (block.toolUse) {
    const use = block.toolUse;
    const result = results.get(use.toolUseId);
    return el("div", { class: "tool", "data-tool-use-id": use.toolUseId },
      el("div", {}, el("span", { class: "name", text: "⚙ " + use.name }), el("span", { class: "muted", text: "  " + use.toolUseId })),
      el("pre", { class: "tool-input", text: pretty(use.input) }),
      result
        ? el("pre", { class: "tool-result" + (result.status === "error" ? " result-error" : ""), text: "↳ " + resultText(result) })
        : el("div", { class: "muted", text: "↳ (result on another page or pending)" }));
  }
  if (block.toolResult) return null; // shown with its call
  if (block.reasoningContent) return el("div", { class: "muted text", text: "(reasoning)" });
  if (block.document) return el("div", { class: "muted", text: `[document ${block.document.name || ""}]` });
  return el("pre", { class: "muted", text: pretty(block) });
}

function renderMessages(messages, offset) {
  const results = new Map();
  for (const message of messages) {
    for (const block of message.content || []) {
      if (block.toolResult) results.set(block.toolResult.toolUseId, block.toolResult);
    }
  }
  const shownResults = new Set();
  const nodes = [];
  messages.forEach((message, i) => {
    const blocks = (message.content || []).map((block) => {
      if (block.toolUse && results.has(block.toolUse.toolUseId)) shownResults.add(block.toolUse.toolUseId);
      return renderBlock(block, results);
    }).filter(Boolean);
    const orphans = (message.content || []).filter((b) => b.toolResult && !shownResults.has(b.toolResult.toolUseId));
    for (const block of orphans) {
      blocks.push(el("div", { class: "tool" }, el("pre", { class: "tool-result", text: "↳ " + resultText(block.toolResult) })));
    }
    if (!blocks.length) return; // a message of tool results only: shown with the calls
    nodes.push(el("div", { class: "msg " + message.role, "data-index": String(offset + i) },
      el("div", { class: "who", text: `#${offset + i} ${message.role}` }), blocks));
  });
  return nodes;
}

let serverInfo = null;
function info() {
  // What this server offers (memory view, signing key), asked once per visit.
  if (!serverInfo) serverInfo = api("GET", "/api/info").catch((error) => { serverInfo = null; throw error; });
  return serverInfo;
}

async function download(sessionId, checkpointId) {
  // A server with a signing key signs the download: its own imports refuse unsigned ones.
  const signed = (await info()).signing ? "?signed=true" : "";
  const response = await api("GET", `/api/sessions/${encodeURIComponent(sessionId)}/checkpoints/${checkpointId}/export${signed}`, undefined, { raw: true });
  const url = URL.createObjectURL(await response.blob());
  const link = el("a", { href: url, download: `${checkpointId}.checkpoint.json` });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function uploadImport(sessionId, file, progress, label) {
  // XMLHttpRequest, not fetch: its upload events give the progress of a big upload.
  // The import runs as a job (202): its checks and its write are polled after.
  return new Promise((resolve, reject) => {
    const request = new XMLHttpRequest();
    request.open("POST", `/api/jobs/import/${encodeURIComponent(sessionId)}`);
    request.setRequestHeader("Content-Type", "application/json");
    for (const [key, value] of Object.entries(authHeaders())) request.setRequestHeader(key, value);
    request.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) {
        progress.max = event.total; progress.value = event.loaded;
        label.textContent = `uploading ${Math.round(100 * event.loaded / event.total)}%`;
      }
    });
    request.addEventListener("load", () => {
      let body = null;
      try { body = JSON.parse(request.responseText); } catch (_) { /* not JSON */ }
      if (request.status === 202) resolve(body);
      else reject(new ApiError(request.status, body && body.error ? body.error.code : "http_" + request.status,
        body && body.error ? body.error.message : request.statusText));
    });
    request.addEventListener("error", () => reject(new Error("the upload failed")));
    request.send(file);
  });
}

async function followJob(job, progress, label, unit) {
  // Poll a job until it ends, showing its phase and progress; its result, or throws its error.
  while (job.state === "running") {
    if (job.total) { progress.max = job.total; progress.value = job.done; }
    else progress.removeAttribute("value");
    label.textContent = job.total ? `${job.phase || ""} ${job.done} of ${job.total} ${unit}`.trim() : (job.phase || "");
    if (job.phase === "writing") progress.removeAttribute("value");
    await new Promise((resolve) => setTimeout(resolve, 300));
    job = await api("GET", `/api/jobs/${job.job_id}`);
  }
  if (job.state === "failed") throw new ApiError(500, job.error.code, job.error.message);
  if (job.total) label.textContent = `${job.done} of ${job.total} ${unit}`;
  return job;
}

function checkpointPanel(sessionId, checkpoints, reload) {
  const notice = el("div", { id: "checkpoint-notice" });
  const say = (node) => notice.replaceChildren(node);
  const items = checkpoints.map((c) => {
    if (c.damaged) {
      return el("li", { class: "damaged", "data-checkpoint-id": c.checkpoint_id },
        el("code", { text: c.checkpoint_id }), " ", el("span", { class: "bad", text: `damaged (${c.kind})` }));
    }
    const restore = el("button", {
      class: "restore danger",
      onclick: async () => {
        const ok = window.confirm(`Restore session ${sessionId} to checkpoint ${c.checkpoint_id} (${c.message_count} messages)?\nThe current state is kept as a pre_restore checkpoint first.`);
        if (!ok) return;
        try {
          status("restoring…");
          const result = await api("POST", `/api/sessions/${encodeURIComponent(sessionId)}/checkpoints/${c.checkpoint_id}/restore`, {});
          sessionStorage.setItem("perdure-notice", `Restored to ${c.checkpoint_id}: ${result.from_messages} → ${result.to_messages} messages; the state before is checkpoint ${result.pre_restore_checkpoint_id}.`);
          reload();
        } catch (error) { say(failure(error)); } finally { status(""); }
      },
    }, "Restore");
    const fork = el("button", {
      class: "fork",
      onclick: async () => {
        try {
          const result = await api("POST", `/api/sessions/${encodeURIComponent(sessionId)}/checkpoints/${c.checkpoint_id}/fork`, {});
          sessionStorage.setItem("perdure-notice", `Forked from ${sessionId} at ${c.checkpoint_id}.`);
          go("/s/" + encodeURIComponent(result.session_id));
        } catch (error) { say(failure(error)); }
      },
    }, "Fork");
    const exportButton = el("button", {
      class: "export",
      onclick: () => download(sessionId, c.checkpoint_id).catch((error) => say(failure(error))),
    }, "Export");
    return el("li", { "data-checkpoint-id": c.checkpoint_id },
      el("div", {}, el("strong", { text: c.label || c.trigger.replace("_", " ") }), " ",
        el("span", { class: "muted", text: `${c.label ? c.trigger + " · " : ""}${c.message_count} messages` })),
      el("div", { class: "muted", text: when(c.created_at) }),
      el("code", { class: "muted", text: c.checkpoint_id }),
      el("div", { class: "actions" }, restore, fork, exportButton));
  });
  const label = el("input", { type: "text", id: "checkpoint-label", placeholder: "label (optional)" });
  const create = el("button", {
    id: "create-checkpoint",
    onclick: async () => {
      try {
        await api("POST", `/api/sessions/${encodeURIComponent(sessionId)}/checkpoints`, { label: label.value || null });
        sessionStorage.setItem("perdure-notice", "Checkpoint created.");
        reload();
      } catch (error) { say(failure(error)); }
    },
  }, "Checkpoint now");
  const file = el("input", { type: "file", id: "import-file", accept: ".json,application/json" });
  const progress = el("progress", { id: "import-progress", value: "0", max: "1", hidden: true });
  const progressLabel = el("span", { id: "import-phase", class: "muted" });
  const importButton = el("button", {
    id: "import-checkpoint",
    onclick: async () => {
      if (!file.files.length) { say(el("div", { class: "notice", text: "Choose an export file first." })); return; }
      progress.hidden = false;
      importButton.disabled = true;
      try {
        const job = await uploadImport(sessionId, file.files[0], progress, progressLabel);
        const meta = (await followJob(job, progress, progressLabel, "steps")).result;
        sessionStorage.setItem("perdure-notice", `Imported checkpoint ${meta.checkpoint_id}.`);
        reload();
      } catch (error) { say(failure(error)); } finally {
        progress.hidden = true;
        progressLabel.textContent = "";
        importButton.disabled = false;
      }
    },
  }, "Import");
  return el("section", { id: "checkpoints" },
    el("h2", { text: `Checkpoints (${checkpoints.length})` }),
    notice,
    checkpoints.length ? el("ol", { class: "timeline" }, items) : el("p", { class: "muted", text: "No checkpoints yet." }),
    el("div", { class: "toolbar" }, label, create),
    el("div", { class: "toolbar" }, file, importButton, progress, progressLabel));
}

async function sessionView(sessionId, params) {
  const base = `/api/sessions/${encodeURIComponent(sessionId)}`;
  const limit = PAGE;
  let offset = params.get("offset");
  status("loading session…");
  let meta, checkpoints, page;
  try {
    meta = await api("GET", base);
    if (offset === null) offset = Math.max(0, meta.message_count - limit); // newest page first
    offset = Number(offset);
    [checkpoints, page] = await Promise.all([
      api("GET", base + "/checkpoints"),
      api("GET", q(base + "/history", { offset, limit })),
    ]);
  } catch (error) {
    show(el("h1", { text: sessionId }), failure(error), el("a", { href: "#/" }, "← all sessions"));
    status("");
    return;
  }
  status("");
  const notice = sessionStorage.getItem("perdure-notice");
  sessionStorage.removeItem("perdure-notice");
  const here = "#/s/" + encodeURIComponent(sessionId);
  const reload = () => { if (location.hash === here) render(); else location.hash = here; };
  const state = meta.agent_state || {};
  const last = page.offset + page.messages.length - 1;
  const pager = (ids) => el("div", { class: "toolbar pager" },
    el("button", { id: ids && "older", disabled: page.offset === 0, onclick: () => go("/s/" + encodeURIComponent(sessionId), { offset: Math.max(0, page.offset - limit) }) }, "← Older"),
    el("span", { id: ids && "page-range", class: "muted", text: page.messages.length ? `messages ${page.offset}–${last} of ${page.total}` : `no messages (of ${page.total})` }),
    el("button", { id: ids && "newer", disabled: page.next_offset >= page.total, onclick: () => go("/s/" + encodeURIComponent(sessionId), { offset: page.next_offset }) }, "Newer →"));
  show(
    el("a", { href: "#/" }, "← all sessions"),
    el("h1", { id: "session-title", text: sessionId }),
    notice ? el("div", { class: "notice", id: "notice", role: "status", text: notice }) : null,
    el("dl", { class: "meta" },
      el("dt", { text: "created" }), el("dd", { text: when(meta.created_at) }),
      el("dt", { text: "updated" }), el("dd", { text: when(meta.updated_at) }),
      el("dt", { text: "messages" }), el("dd", { id: "message-count", text: String(meta.message_count) }),
      el("dt", { text: "state keys" }), el("dd", { text: (state.state_keys || []).join(", ") || "–" }),
      el("dt", { text: "interrupts" }), el("dd", { text: String(state.interrupts || 0) })),
    el("div", { class: "layout" },
      el("section", { id: "history" }, el("h2", { text: "History" }), pager(true),
        el("div", { id: "messages" }, renderMessages(page.messages, page.offset)), pager(false)),
      checkpointPanel(sessionId, checkpoints.checkpoints, reload)),
  );
}

// ----------------------------------------------------------------- verify

async function verifyView() {
  const progress = el("progress", { id: "verify-progress", hidden: true });
  const label = el("span", { id: "verify-count", class: "muted" });
  const report = el("div", { id: "verify-report" });
  const start = el("button", {
    id: "run-verify",
    onclick: async () => {
      start.disabled = true;
      report.replaceChildren();
      progress.hidden = false;
      progress.removeAttribute("value");
      try {
        const job = await followJob(await api("POST", "/api/jobs/verify", {}), progress, label, "sessions");
        report.replaceChildren(renderReport(job.result));
      } catch (error) {
        report.replaceChildren(failure(error));
      } finally {
        progress.hidden = true;
        start.disabled = false;
      }
    },
  }, "Verify the store");
  show(el("h1", { text: "Verify" }),
    el("p", { class: "muted", text: "Reads every session and checkpoint in full and checks it against its hash chain. Nothing is written." }),
    el("div", { class: "toolbar" }, start, progress, label), report);
}

function renderReport(result) {
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  const summary = `${plural(result.sessions_checked, "session")} and ${plural(result.checkpoints_checked, "checkpoint")} verified`;
  if (result.clean) return el("div", { class: "notice good", id: "verify-clean", text: "✓ " + summary + ": no damage" });
  return el("div", {},
    el("div", { class: "notice bad", text: `✗ ${result.damaged_sessions.length} damaged (${summary})` }),
    el("table", { id: "damage" },
      el("thead", {}, el("tr", {}, el("th", { text: "Session" }), el("th", { text: "Damage" }), el("th", { text: "Position" }), el("th", { text: "Detail" }))),
      el("tbody", {}, result.damage.map((d) => el("tr", {},
        el("td", {}, d.session_id ? el("a", { href: "#/s/" + encodeURIComponent(d.session_id) }, d.session_id) : "(store)"),
        el("td", { text: d.kind }), el("td", { text: d.position }), el("td", { text: d.detail }))))));
}

// ----------------------------------------------------------------- memory

async function memoryView(params) {
  const namespace = params.get("ns") || "";
  const query = params.get("q") || "";
  const offset = Number(params.get("offset") || 0);
  const nsInput = el("input", { type: "text", id: "namespace", placeholder: "user / namespace", value: namespace });
  const qInput = el("input", { type: "search", id: "memory-search", placeholder: "search", value: query });
  const submit = () => go("/memory", { ns: nsInput.value, q: qInput.value });
  for (const input of [nsInput, qInput]) input.addEventListener("keydown", (e) => { if (e.key === "Enter") submit(); });
  const head = [el("h1", { text: "Memory" }), el("div", { class: "toolbar" }, nsInput, qInput, el("button", { onclick: submit }, "Show"))];
  if (!namespace) {
    show(...head, el("p", { class: "muted", text: "Name a user (memory namespace) to see what is remembered." }));
    return;
  }
  let page;
  try {
    page = await api("GET", q(`/api/memory/${encodeURIComponent(namespace)}/entries`, { q: query, offset, limit: PAGE }));
  } catch (error) {
    show(...head, failure(error));
    return;
  }
  const rows = page.entries.map((entry) => el("tr", {},
    el("td", { class: "num", text: String(entry.memory_id) }),
    el("td", { text: entry.content }),
    el("td", { text: entry.created_at ? when(new Date(entry.created_at * 1000).toISOString()) : "–" }),
    el("td", { class: "num", text: entry.score == null ? "" : entry.score.toFixed(3) }),
    el("td", {}, el("button", {
      class: "danger delete-memory",
      onclick: async () => {
        if (!window.confirm(`Delete memory ${entry.memory_id} of ${namespace}?\n“${entry.content}”`)) return;
        try {
          await api("DELETE", `/api/memory/${encodeURIComponent(namespace)}/entries/${entry.memory_id}`);
          memoryView(params);
        } catch (error) { main().prepend(failure(error)); }
      },
    }, "Delete"))));
  const pager = el("div", { class: "toolbar" },
    offset > 0 && !query ? el("button", { onclick: () => go("/memory", { ns: namespace, offset: Math.max(0, offset - PAGE) }) }, "← Previous") : null,
    page.next_offset !== null ? el("button", { onclick: () => go("/memory", { ns: namespace, offset: page.next_offset }) }, "Next →") : null,
    el("span", { class: "muted", text: query ? `${page.entries.length} best matches of ${page.total}` : `${page.total} memories` }));
  show(...head, page.entries.length
    ? el("table", { id: "memories" },
      el("thead", {}, el("tr", {}, el("th", { class: "num", text: "Id" }), el("th", { text: "Memory" }), el("th", { text: "Added" }), el("th", { class: "num", text: query ? "Score" : "" }), el("th", {}))),
      el("tbody", {}, rows))
    : el("p", { class: "muted", text: "Nothing remembered." }), pager);
}

// ----------------------------------------------------------------- router

function render() {
  const { parts, params } = route();
  for (const link of document.querySelectorAll("nav a")) link.classList.remove("active");
  const section = parts[0] === "memory" ? "nav-memory" : parts[0] === "verify" ? "nav-verify" : "nav-sessions";
  document.getElementById(section).classList.add("active");
  if (parts[0] === "s" && parts[1]) return sessionView(parts[1], params);
  if (parts[0] === "memory") return memoryView(params);
  if (parts[0] === "verify") return verifyView();
  return sessionList(params);
}

window.addEventListener("hashchange", render);
window.addEventListener("DOMContentLoaded", render);
