// ctrlg editor: the page talks to the JSON API (/api/generate, /api/progress, /api/cancel).
"use strict";

const $ = (id) => document.getElementById(id);
const doc = $("document");
const preview = $("preview");
const statusLine = $("status");
const progressBar = $("progress");
const list = $("candidates");

let selection = { start: 0, end: 0 };   // the document's cursor / selection when last seen
let pending = null;                      // { id, controller, timer, target } of the running request
let shown = null;                        // { target, candidates } being previewed

function setStatus(text, isError = false) {
  statusLine.textContent = text;
  statusLine.classList.toggle("error", isError);
}

function operation() { return document.querySelector("input[name=operation]:checked").value; }

function rememberSelection() {
  if (pending || shown) return;          // the target is frozen while candidates are on screen
  selection = { start: doc.selectionStart, end: doc.selectionEnd };
  const text = doc.value;
  const op = selection.end > selection.start ? "rewrite"
    : (text.slice(selection.start).trim() ? "insert" : "continue");
  $("op-" + op).checked = true;
  const words = (s) => (s.match(/\S+/g) || []).length;
  $("cursor-info").textContent = selection.end > selection.start
    ? `Selection of ${words(text.slice(selection.start, selection.end))} words (rewrite replaces it).`
    : `Cursor after ${words(text.slice(0, selection.start))} words` +
      (text.slice(selection.start).trim() ? ", before the rest of the document (insert)." : " (continue).");
}
["select", "keyup", "mouseup", "input", "focus"].forEach((e) => doc.addEventListener(e, rememberSelection));

function lines(id) {
  return $(id).value.split("\n").map((s) => s.trim()).filter((s) => s.length > 0);
}
function intOrNull(id) {
  const v = $(id).value.trim();
  return v === "" ? null : parseInt(v, 10);
}

function target() {
  // prefix / suffix and the span the accepted candidate replaces
  const text = doc.value;
  const op = operation();
  let { start, end } = selection;
  if (op === "rewrite" && end <= start) throw new Error("select the span to rewrite first");
  if (op !== "rewrite") end = start;
  return { op, start, end, prefix: text.slice(0, start),
           suffix: op === "continue" ? "" : text.slice(end), text };
}

async function generate() {
  let t;
  try { t = target(); } catch (err) { setStatus(err.message, true); return; }
  const id = "r" + Math.random().toString(36).slice(2, 12);
  const body = {
    prefix: t.prefix, suffix: t.suffix, keyphrases: lines("keyphrases"), banned: lines("banned"),
    min_words: intOrNull("min-words"), max_words: intOrNull("max-words"),
    allow_newlines: $("allow-newlines").checked,
    num_candidates: intOrNull("num-candidates") || 4, max_new_tokens: intOrNull("max-new-tokens") || 32,
    mode: $("method").value, seed: Math.floor(Math.random() * 1e9), request_id: id,
  };
  clearCandidates();
  const controller = new AbortController();
  pending = { id, controller, target: t, timer: setInterval(() => pollProgress(id, body.max_new_tokens), 250) };
  $("generate").disabled = true;
  $("cancel").disabled = false;
  progressBar.removeAttribute("value");
  setStatus("Sending…");
  try {
    const response = await fetch("/api/generate", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body), signal: controller.signal,
    });
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
    finish();
    if (!data.candidates.length) { setStatus(`No candidate finished in ${data.seconds.toFixed(1)} s.`, true); return; }
    setStatus(`${data.candidates.length} candidate(s) in ${data.seconds.toFixed(1)} s — click one to preview, Accept to insert.`);
    showCandidates(t, data.candidates);
  } catch (err) {
    finish();
    setStatus(err.name === "AbortError" ? "Cancelled." : err.message, err.name !== "AbortError");
  }
}

function finish() {
  if (!pending) return;
  clearInterval(pending.timer);
  pending = null;
  $("generate").disabled = false;
  $("cancel").disabled = true;
  progressBar.value = 0;
}

async function pollProgress(id, maxTokens) {
  if (!pending || pending.id !== id) return;
  try {
    const response = await fetch(`/api/progress/${id}`);
    if (!response.ok || !pending || pending.id !== id) return;
    const p = await response.json();
    // the request may have finished or been cancelled while this poll was in flight: a late
    // "Generating…" must not overwrite "Cancelled." or the candidates' status line
    if (!pending || pending.id !== id) return;
    const labels = { queued: "Waiting for the model…", building: "Building the constraint…",
                     generating: `Generating: token ${p.tokens} of at most ${maxTokens}…` };
    if (labels[p.state]) setStatus(labels[p.state]);
    if (p.state === "generating") progressBar.value = Math.min(1, p.tokens / maxTokens);
  } catch (err) { /* the next poll will tell */ }
}

async function cancel() {
  if (!pending) return;
  const { id, controller } = pending;
  setStatus("Cancelling…");
  // stop waiting at once (the page shows "Cancelled."), then tell the server, which also cancels
  // a request whose client went away: a slow server cannot hold the page in "Cancelling…"
  controller.abort();
  try { await fetch(`/api/cancel/${id}`, { method: "POST" }); } catch (err) { /* aborting suffices */ }
}

function clearCandidates() {
  list.replaceChildren();
  shown = null;
  preview.hidden = true;
  doc.hidden = false;
}

function showCandidates(t, candidates) {
  shown = { target: t, candidates };
  candidates.forEach((c, i) => {
    const item = document.createElement("li");
    item.className = "candidate";
    item.dataset.index = i;
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = c.text;
    const ll = document.createElement("span");
    ll.className = "ll";
    ll.textContent = c.log_likelihood === null ? "log p = −∞" : `log p = ${c.log_likelihood.toFixed(2)}`;
    ll.title = "LM log-likelihood of the candidate followed by the text after it (nats)";
    const accept = document.createElement("button");
    accept.className = "accept";
    accept.textContent = "Accept";
    accept.addEventListener("click", (e) => { e.stopPropagation(); acceptCandidate(i); });
    item.append(text, ll, accept);
    item.addEventListener("click", () => previewCandidate(i));
    list.append(item);
  });
  previewCandidate(0);
}

function previewCandidate(i) {
  const { target: t, candidates } = shown;
  list.querySelectorAll(".candidate").forEach((el) => el.classList.toggle("selected", el.dataset.index == i));
  const before = document.createElement("span");
  before.className = "context";
  before.textContent = t.text.slice(0, t.start);
  const removed = document.createElement("del");
  removed.textContent = t.text.slice(t.start, t.end);
  const mark = document.createElement("mark");
  mark.textContent = candidates[i].text;
  const after = document.createElement("span");
  after.className = "context";
  after.textContent = t.text.slice(t.end);
  preview.replaceChildren(before, removed, mark, after);
  doc.hidden = true;
  preview.hidden = false;
  mark.scrollIntoView({ block: "center" });
}

function acceptCandidate(i) {
  const { target: t, candidates } = shown;
  const text = candidates[i].text;
  doc.value = t.text.slice(0, t.start) + text + t.text.slice(t.end);
  clearCandidates();
  const cursor = t.start + text.length;
  doc.focus();
  doc.setSelectionRange(cursor, cursor);
  rememberSelection();
  setStatus("Inserted. Place the cursor for the next edit.");
}

preview.addEventListener("click", () => { clearCandidates(); doc.focus(); setStatus("Discarded the candidates."); });
$("generate").addEventListener("click", generate);
$("cancel").addEventListener("click", cancel);

async function loadExamples() {
  try {
    const examples = await (await fetch("/api/examples")).json();
    const select = $("examples");
    examples.forEach((e, i) => {
      const option = document.createElement("option");
      option.value = i;
      option.textContent = `${e.domain} · ${e.code}`;
      select.append(option);
    });
    select.addEventListener("change", () => {
      if (select.value === "") return;
      clearCandidates();
      doc.value = examples[select.value].text;
      doc.focus();
      doc.setSelectionRange(doc.value.length, doc.value.length);
      rememberSelection();
    });
  } catch (err) { /* examples are optional */ }
}

async function loadHealth() {
  const pill = $("health");
  try {
    const h = await (await fetch("/api/health")).json();
    pill.textContent = h.model + (h.hmm_hidden_size ? ` · HMM h = ${h.hmm_hidden_size}` : " · no HMM");
    if (!h.modes.includes("ctrlg")) { $("method").value = "logical"; $("method").options[0].disabled = true; }
  } catch (err) { pill.textContent = "server unreachable"; pill.classList.add("error"); }
}

loadExamples();
loadHealth();
rememberSelection();
