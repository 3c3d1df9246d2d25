// ragqa's web chat page. Plain JavaScript, no build step and no dependencies.
//
// How an answer arrives: fetch() POSTs /v1/ask with stream: true and reads the response body
// as server-sent events with the small parser below (EventSource cannot POST). Each event
// carries "id: <stream_id>:<seq>". If the connection drops before the "done" or "error"
// event, the page resumes with GET /v1/streams/<stream_id> and the header Last-Event-ID set
// to the last event it handled, pausing longer between each failed attempt; the server sends
// exactly the events after that one, and events already seen (seq not above the last) are
// ignored anyway, so no text is lost or repeated. "Stop" aborts the fetch for good: the
// server then aborts the generation after its disconnect grace period.
"use strict";

(() => {
  const RETRY_MS = [250, 500, 1000, 2000, 4000];  // then 4000 again, up to MAX_ATTEMPTS in a row
  const MAX_ATTEMPTS = 12;
  const KEY_STORE = "ragqa.apiKey";
  const SAFE_LINK = new Set(["http:", "https:", "file:"]);

  const $ = (id) => document.getElementById(id);
  const ui = {
    form: $("ask"), question: $("question"), send: $("send"), stop: $("stop"), newConv: $("new"),
    source: $("source"), sourceNote: $("source-note"), from: $("modified-from"), to: $("modified-to"),
    key: $("api-key"), connection: $("connection"), transcript: $("transcript"), empty: $("empty"),
    status: $("status"), template: $("turn-template"),
  };

  let conversationId = null;
  let current = null;  // the turn being answered
  let turns = 0;

  // -- server-sent events ---------------------------------------------------------------
  // The event stream format of the HTML standard: lines end with CRLF, LF or CR; "data"
  // lines accumulate; a blank line dispatches; lines starting with ":" are comments.
  class SSEParser {
    constructor(onEvent) {
      this.onEvent = onEvent;
      this.buffer = "";
      this.data = [];
      this.type = "";
      this.lastEventId = "";
    }

    feed(text) {
      this.buffer += text;
      for (;;) {
        const end = this.buffer.search(/\r\n|\r|\n/);
        if (end < 0) return;
        // A CR at the very end may be the first half of a CRLF split across two chunks.
        if (this.buffer[end] === "\r" && end === this.buffer.length - 1) return;
        const size = this.buffer.startsWith("\r\n", end) ? 2 : 1;
        const line = this.buffer.slice(0, end);
        this.buffer = this.buffer.slice(end + size);
        this.line(line);
      }
    }

    // At the end of the body: a last CR held back above ends its line after all.
    end() {
      if (this.buffer.endsWith("\r")) this.feed("\n");
    }

    line(line) {
      if (line === "") {
        if (this.data.length) {
          this.onEvent({ id: this.lastEventId, event: this.type || "message", data: this.data.join("\n") });
        }
        this.data = [];
        this.type = "";
        return;
      }
      if (line.startsWith(":")) return;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") this.data.push(value);
      else if (field === "event") this.type = value;
      else if (field === "id" && !value.includes("\0")) this.lastEventId = value;
    }
  }

  // -- requests -------------------------------------------------------------------------
  function headers(extra = {}) {
    const h = { Accept: "application/json, text/event-stream", ...extra };
    const key = ui.key.value.trim();
    if (key) h.Authorization = `Bearer ${key}`;
    return h;
  }

  async function errorMessage(res) {
    try {
      const body = await res.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (_) { /* not JSON */ }
    return `${res.status} ${res.statusText}`.trim();
  }

  function sleep(ms, signal) {
    return new Promise((resolve, reject) => {
      if (signal.aborted) { reject(signal.reason); return; }
      const timer = setTimeout(() => { signal.removeEventListener("abort", stop); resolve(); }, ms);
      const stop = () => { clearTimeout(timer); reject(signal.reason); };
      signal.addEventListener("abort", stop, { once: true });
    });
  }

  function retryAfterMs(res, fallback) {
    const seconds = Number(res.headers.get("Retry-After"));
    return Number.isFinite(seconds) && seconds > 0 ? Math.min(seconds * 1000, 30000) : fallback;
  }

  // -- filters --------------------------------------------------------------------------
  async function loadSources() {
    let res;
    try {
      res = await fetch("v1/sources", { headers: headers(), cache: "no-store" });
    } catch (_) {
      ui.sourceNote.textContent = "The list of sources could not be loaded; asking across all of them.";
      return;
    }
    if (!res.ok) {
      if (res.status === 401) ui.connection.open = true;
      ui.sourceNote.textContent = res.status === 401
        ? "Enter an API key to list the sources; until then the page asks across all of them."
        : "The list of sources is not available to this key; asking across all of them.";
      return;
    }
    const sources = await res.json();
    const chosen = ui.source.value;
    ui.source.replaceChildren(new Option("All sources", ""));
    for (const s of sources) {
      const label = s.documents === undefined ? s.name : `${s.name} (${s.documents} documents)`;
      ui.source.append(new Option(label, s.name, false, s.name === chosen));
    }
    ui.sourceNote.textContent = "";
  }

  function filters() {
    const f = {};
    if (ui.source.value) f.source = ui.source.value;
    // Whole UTC days, both ends included (a bare date would mean midnight, leaving out the last day).
    if (ui.from.value) f.modified_from = `${ui.from.value}T00:00:00Z`;
    if (ui.to.value) f.modified_to = `${ui.to.value}T23:59:59.999999Z`;
    return Object.keys(f).length ? f : null;
  }

  // -- rendering ------------------------------------------------------------------------
  function setStatus(text) {
    ui.status.textContent = text;
  }

  function setState(turn, state, text) {
    turn.el.dataset.state = state;
    turn.statusEl.textContent = text;
    setStatus(text);
  }

  function newTurn(question) {
    turns += 1;
    const el = ui.template.content.firstElementChild.cloneNode(true);
    el.id = `turn-${turns}`;
    el.querySelector(".question").textContent = question;
    ui.empty.hidden = true;
    ui.transcript.append(el);
    const turn = {
      id: el.id, el, text: "", seq: 0, streamId: null, reconnects: 0, fails: 0, finished: false, controller: null,
      answerEl: el.querySelector(".answer"), statusEl: el.querySelector(".turn-status"),
      sourcesEl: el.querySelector(".sources"), listEl: el.querySelector(".citations"),
    };
    el.dataset.reconnects = "0";
    el.scrollIntoView({ block: "end" });
    return turn;
  }

  // The answer as text, with each [n] a link to source n of this turn.
  function renderAnswer(turn) {
    const parts = [];
    let last = 0;
    for (const m of turn.text.matchAll(/\[(\d+)\]/g)) {
      parts.push(turn.text.slice(last, m.index));
      const a = document.createElement("a");
      a.className = "cite-ref";
      a.href = `#${turn.id}-source-${m[1]}`;
      a.textContent = m[0];
      a.title = `Source ${m[1]}`;
      if (turn.inferred && turn.inferred.has(Number(m[1]))) {
        a.classList.add("inferred");
        a.title += " (inferred: the model did not cite it)";
      }
      parts.push(a);
      last = m.index + m[0].length;
    }
    parts.push(turn.text.slice(last));
    turn.answerEl.replaceChildren(...parts);
  }

  function safeUrl(url) {
    try {
      const parsed = new URL(url, document.baseURI);
      return SAFE_LINK.has(parsed.protocol) ? parsed.href : null;
    } catch (_) {
      return null;
    }
  }

  function renderCitations(turn, citations) {
    const items = citations.map((c) => {
      const li = document.createElement("li");
      li.id = `${turn.id}-source-${c.label}`;
      li.value = c.label;
      const href = safeUrl(c.url);
      const title = c.title || c.url;
      const head = href ? document.createElement("a") : document.createElement("span");
      head.className = "source-title";
      head.textContent = title;
      if (href) {
        head.href = href;
        head.target = "_blank";
        head.rel = "noopener noreferrer";
      }
      li.append(head);
      if (c.inferred) {
        // ragqa added this label after a sentence the passage supports; the model did not cite it
        li.classList.add("inferred");
        const mark = document.createElement("span");
        mark.className = "inferred-mark";
        mark.textContent = "inferred";
        mark.title = "The model did not cite this source; it supports a sentence of the answer.";
        li.append(" ", mark);
      }
      if (c.url && c.url !== title) {
        const url = document.createElement("span");
        url.className = "source-url";
        url.textContent = c.url;
        li.append(" ", url);
      }
      if (c.modified) {
        const when = document.createElement("time");
        when.dateTime = c.modified;
        when.textContent = `modified ${c.modified.slice(0, 10)}`;
        li.append(" ", when);
      }
      if (c.snippet) {
        const snippet = document.createElement("p");
        snippet.className = "snippet";
        snippet.textContent = c.snippet;
        li.append(snippet);
      }
      return li;
    });
    turn.listEl.replaceChildren(...items);
    turn.sourcesEl.hidden = items.length === 0;
  }

  // -- one answer -----------------------------------------------------------------------
  // Handle one event; true when it ends the answer. Events at or before the last seq seen
  // are dropped, so a resumed stream can never repeat text.
  function handle(turn, ev) {
    const cut = ev.id.lastIndexOf(":");
    if (cut > 0) {
      const seq = Number(ev.id.slice(cut + 1));
      if (Number.isInteger(seq)) {
        if (seq <= turn.seq) return false;
        turn.seq = seq;
        turn.streamId = ev.id.slice(0, cut);
        turn.el.dataset.lastEventId = ev.id;
      }
    }
    let data;
    try {
      data = JSON.parse(ev.data);
    } catch (_) {
      return false;
    }
    if (ev.event === "sources") {
      if (data.conversation_id) conversationId = data.conversation_id;
      const found = (data.citations || []).length;
      renderCitations(turn, data.citations || []);
      turn.degraded = Boolean(data.degraded);
      // the sources are known before the model writes a word: say what it is doing meanwhile
      if (!turn.text) {
        setState(turn, "reading", found
          ? `Found ${found} source${found === 1 ? "" : "s"}; the model is reading ${found === 1 ? "it" : "them"}…`
          : "No source matched; the model is answering…");
      }
    } else if (ev.event === "delta") {
      if (!turn.text && turn.el.dataset.state === "reading") setState(turn, "streaming", "Answering…");
      turn.text += data.text || "";
      renderAnswer(turn);
    } else if (ev.event === "done") {
      renderCitations(turn, data.citations || []);
      turn.inferred = new Set((data.citations || []).filter((c) => c.inferred).map((c) => c.label));
      if (turn.inferred.size) renderAnswer(turn);
      const seconds = data.timings && data.timings.total_ms ? ` in ${(data.timings.total_ms / 1000).toFixed(1)} s` : "";
      const note = data.degraded ? " The model was unavailable: this answer quotes the sources directly." : "";
      setState(turn, "done", `Answered${seconds}.${note}`);
      return true;
    } else if (ev.event === "error") {
      const message = data.error && data.error.message ? data.error.message : "the answer failed";
      setState(turn, "error", `Error: ${message}`);
      return true;
    }
    return false;
  }

  // Read one response's events until the answer ends (true) or the body ends early (false).
  // A dropped connection rejects from read().
  async function follow(turn, res) {
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new SSEParser((ev) => {
      if (!turn.finished && handle(turn, ev)) turn.finished = true;
    });
    try {
      while (!turn.finished) {
        const { value, done } = await reader.read();
        if (done) {
          parser.end();
          break;
        }
        parser.feed(value);
      }
    } finally {
      reader.cancel().catch(() => {});
    }
    return turn.finished;
  }

  // Resume after a drop: a response that follows the stream again, or null (the turn says why).
  // turn.fails counts attempts since the stream last made progress; it sets the pause.
  async function reconnect(turn, signal) {
    while (turn.fails < MAX_ATTEMPTS) {
      turn.fails += 1;
      const wait = RETRY_MS[Math.min(turn.fails - 1, RETRY_MS.length - 1)];
      setState(turn, "reconnecting", `Connection lost; resuming (attempt ${turn.fails} of ${MAX_ATTEMPTS})…`);
      await sleep(wait, signal);
      let res;
      try {
        res = await fetch(`v1/streams/${encodeURIComponent(turn.streamId)}`, {
          headers: headers({ "Last-Event-ID": `${turn.streamId}:${turn.seq}` }), cache: "no-store", signal,
        });
      } catch (err) {
        if (signal.aborted) throw err;
        continue;  // still offline
      }
      if (res.ok) {
        turn.reconnects += 1;
        turn.el.dataset.reconnects = String(turn.reconnects);
        setState(turn, "streaming", "Reconnected; answering…");
        return res;
      }
      if (res.status === 429 || res.status >= 500) {
        await sleep(retryAfterMs(res, 0), signal);
        continue;
      }
      setState(turn, "error", `The answer could not be resumed: ${await errorMessage(res)}`);
      return null;
    }
    setState(turn, "error", "The connection was lost and the answer could not be resumed. Ask again.");
    return null;
  }

  async function answer(turn, body) {
    const controller = new AbortController();
    turn.controller = controller;
    const { signal } = controller;
    try {
      let res = await fetch("v1/ask", {
        method: "POST", body: JSON.stringify(body), cache: "no-store", signal,
        headers: headers({ "Content-Type": "application/json" }),
      });
      if (!res.ok) {
        if (res.status === 401) ui.connection.open = true;
        setState(turn, "error", `Error: ${await errorMessage(res)}`);
        return;
      }
      turn.streamId = res.headers.get("X-Stream-Id");
      for (;;) {
        const seqBefore = turn.seq;
        try {
          if (await follow(turn, res)) return;
        } catch (err) {
          if (signal.aborted) throw err;
        }
        if (!turn.streamId) {
          setState(turn, "error", "The connection was lost before the answer began. Ask again.");
          return;
        }
        if (turn.seq > seqBefore) turn.fails = 0;
        res = await reconnect(turn, signal);
        if (res === null) return;
      }
    } catch (err) {
      if (signal.aborted) {
        setState(turn, "stopped", "Stopped.");
      } else {
        setState(turn, "error", `Error: ${err && err.message ? err.message : err}`);
      }
    }
  }

  async function ask(question) {
    const turn = newTurn(question);
    current = turn;
    ui.send.disabled = true;
    ui.stop.disabled = false;
    setState(turn, "streaming", "Searching the sources…");
    const body = { question, stream: true };
    const f = filters();
    if (f) body.filters = f;
    if (conversationId) body.conversation_id = conversationId;
    try {
      await answer(turn, body);
    } finally {
      turn.answerEl.setAttribute("aria-busy", "false");
      current = null;
      ui.send.disabled = false;
      ui.stop.disabled = true;
    }
  }

  // -- wiring ---------------------------------------------------------------------------
  ui.form.addEventListener("submit", (e) => {
    e.preventDefault();
    const question = ui.question.value.trim();
    if (!question || current) return;
    ui.question.value = "";
    ask(question);
  });

  ui.question.addEventListener("keydown", (e) => {
    // Not while an input method is composing (Chinese, Japanese...): Enter picks a candidate there.
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      ui.form.requestSubmit();
    }
  });

  ui.stop.addEventListener("click", () => {
    if (current && current.controller) current.controller.abort();
    ui.question.focus();
  });

  ui.newConv.addEventListener("click", () => {
    if (current && current.controller) current.controller.abort();
    conversationId = null;
    for (const el of ui.transcript.querySelectorAll(".turn")) el.remove();
    ui.empty.hidden = false;
    setStatus("New conversation.");
    ui.question.focus();
  });

  ui.key.value = sessionStorage.getItem(KEY_STORE) || "";
  ui.key.addEventListener("change", () => {
    const key = ui.key.value.trim();
    if (key) sessionStorage.setItem(KEY_STORE, key);
    else sessionStorage.removeItem(KEY_STORE);
    loadSources();
  });

  loadSources();
})();
