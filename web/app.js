"use strict";
// metro's chat: conversations kept in the browser (IndexedDB), answers streamed from
// /v1/chat/completions, Markdown through marked and code through highlight.js (both from
// Debian's packages, served by the binary). Model output is untrusted: raw HTML in it is
// shown as text, links keep only http(s) and mailto targets, images become links, and the
// server's Content-Security-Policy allows no inline script.
(() => {
  const $ = (id) => document.getElementById(id);
  const SETTINGS_KEY = "metro-ui-settings";
  const CURRENT_KEY = "metro-ui-current";
  const DEFAULTS = { model: "", system: "", temperature: 0.7, top_p: 1, max_tokens: 512, seed: "", api_key: "" };

  // ---- settings (localStorage) -------------------------------------------------------
  function loadSettings() {
    let s = {};
    try { s = JSON.parse(localStorage.getItem(SETTINGS_KEY) || "{}") || {}; } catch (_) { s = {}; }
    return Object.assign({}, DEFAULTS, s);
  }
  let settings = loadSettings();
  const saveSettings = () => localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));

  // ---- conversations (IndexedDB; memory when the browser offers none) ------------------
  const store = (() => {
    const memory = new Map();
    let opened = null;
    function open() {
      if (!opened) {
        opened = new Promise((resolve) => {
          if (!window.indexedDB) { resolve(null); return; }
          const req = indexedDB.open("metro-ui", 1);
          req.onupgradeneeded = () => req.result.createObjectStore("conversations", { keyPath: "id" });
          req.onsuccess = () => resolve(req.result);
          req.onerror = () => resolve(null);
        });
      }
      return opened;
    }
    async function run(mode, fn) {
      const db = await open();
      if (!db) return null;
      return new Promise((resolve, reject) => {
        const tx = db.transaction("conversations", mode);
        const req = fn(tx.objectStore("conversations"));
        tx.oncomplete = () => resolve(req.result);
        tx.onerror = () => reject(tx.error);
        tx.onabort = () => reject(tx.error);
      });
    }
    return {
      async all() {
        const rows = await run("readonly", (s) => s.getAll());
        return rows || [...memory.values()];
      },
      async put(c) {
        const plain = JSON.parse(JSON.stringify(c));
        if ((await open()) === null) memory.set(c.id, plain); else await run("readwrite", (s) => s.put(plain));
      },
      async remove(id) {
        if ((await open()) === null) memory.delete(id); else await run("readwrite", (s) => s.delete(id));
      },
    };
  })();

  let conversations = [];  // newest first
  let current = null;      // the conversation on screen (null: a new one, not yet stored)
  let busy = null;         // { controller, conv, msg } while an answer streams

  // ---- rendering helpers ---------------------------------------------------------------
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function button(label, onclick, cls) {
    const b = el("button", cls || "", label);
    b.type = "button";
    b.onclick = onclick;
    return b;
  }
  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }
  const safeUrl = (href) => typeof href === "string" && /^(https?:|mailto:|#)/i.test(href.trim());

  let markedReady = false;
  function setUpMarkdown() {
    if (markedReady || !window.marked) return;
    markedReady = true;
    window.marked.use({
      gfm: true, breaks: true, mangle: false, headerIds: false, langPrefix: "hljs language-",
      highlight(code, lang) {
        const hl = window.hljs;
        if (!hl) return null;
        try {
          if (lang && hl.getLanguage(lang)) return hl.highlight(lang, code, true).value;
          return hl.highlightAuto(code).value;
        } catch (_) {
          return null;
        }
      },
      renderer: {
        html(html) { return escapeHtml(html); },
        link(href, title, text) { return safeUrl(href) ? false : text; },
        image(href, title, text) {
          if (!safeUrl(href)) return escapeHtml(text || "");
          return `<a href="${escapeHtml(href)}" target="_blank" rel="noopener noreferrer">${escapeHtml(text || href)}</a>`;
        },
      },
    });
  }
  // Markdown to HTML that is safe to assign to innerHTML.
  function renderMarkdown(text) {
    setUpMarkdown();
    if (!window.marked) return `<p style="white-space:pre-wrap">${escapeHtml(text)}</p>`;
    const html = window.marked.parse(text);
    // Links open beside the chat, without handing it the opener.
    return html.replace(/<a href=/g, '<a target="_blank" rel="noopener noreferrer" href=');
  }

  function statsText(m) {
    const s = m.stats;
    if (!s || m.role !== "assistant") return "";
    const parts = [];
    if (s.tokens) parts.push(`${s.exact ? "" : "~"}${s.tokens} tokens`);
    if (s.ttft != null) parts.push(`first after ${s.ttft.toFixed(2)} s`);
    if (s.tps != null) parts.push(`${s.tps.toFixed(1)} tokens/s`);
    if (s.stopped) parts.push("stopped");
    else if (s.finish && s.finish !== "stop") parts.push(`finish: ${s.finish}`);
    return parts.join(" · ");
  }

  function fillBody(body, m, streaming) {
    if (m.role === "assistant") {
      body.innerHTML = renderMarkdown(m.content);
      if (m.error) body.append(el("p", "", "error: " + m.error));
      body.classList.toggle("cursor", !!streaming);
    } else {
      body.textContent = m.content;
    }
  }

  function messageView(m, i) {
    const d = el("div", `msg ${m.role}${m.error ? " error" : ""}`);
    d.dataset.index = String(i);
    const body = el("div", "body");
    fillBody(body, m, busy && busy.msg === m);
    const foot = el("div", "foot");
    foot.append(el("span", "stats", statsText(m)));
    if (!busy) {
      if (m.role === "user") foot.append(button("edit", () => startEdit(d, i), "edit-btn"));
      if (m.role === "assistant") {
        foot.append(button("copy", () => navigator.clipboard && navigator.clipboard.writeText(m.content), "copy-btn"));
        if (i === current.messages.length - 1) foot.append(button("regenerate", regenerate, "regen-btn"));
      }
    }
    d.append(body, foot);
    return d;
  }

  function renderLog() {
    const log = $("log");
    log.textContent = "";
    $("conv-title").textContent = current ? current.title : "";
    if (!current || current.messages.length === 0) {
      log.append(el("div", "empty", "Start a conversation below."));
      return;
    }
    current.messages.forEach((m, i) => log.append(messageView(m, i)));
    log.scrollTop = log.scrollHeight;
  }

  // Repaints the streaming message at most once a frame.
  let paintQueued = false;
  function paintStreaming() {
    if (paintQueued) return;
    paintQueued = true;
    requestAnimationFrame(() => {
      paintQueued = false;
      if (!busy || busy.conv !== current) return;
      const log = $("log");
      const view = log.querySelector(`.msg[data-index="${current.messages.length - 1}"] .body`);
      if (!view) return;
      const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
      fillBody(view, busy.msg, true);
      if (atBottom) log.scrollTop = log.scrollHeight;
    });
  }

  function renderList() {
    const nav = $("conversations");
    nav.textContent = "";
    for (const c of conversations) {
      const row = el("div", "conv" + (current && c.id === current.id ? " active" : ""));
      row.dataset.id = c.id;
      const name = el("span", "name", c.title || "New chat");
      name.title = c.title || "";
      const del = button("×", (e) => { e.stopPropagation(); removeConversation(c.id); }, "del");
      del.title = "Delete this conversation";
      row.onclick = () => select(c.id);
      row.append(name, del);
      nav.append(row);
    }
  }

  function setBusy(on) {
    document.body.dataset.busy = on ? "1" : "0";
    $("send").hidden = on;
    $("stop").hidden = !on;
    $("new-chat").disabled = on;
  }

  // ---- conversations -------------------------------------------------------------------
  const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 10);
  const titleOf = (text) => { const t = text.replace(/\s+/g, " ").trim(); return t.length > 48 ? t.slice(0, 47) + "…" : t; };

  async function save(conv) {
    conv.updated = Date.now();
    await store.put(conv);
    if (!conversations.includes(conv)) conversations.unshift(conv);
    conversations.sort((a, b) => b.updated - a.updated);
    renderList();
  }
  function select(id) {
    if (busy) return;
    current = conversations.find((c) => c.id === id) || null;
    if (current) localStorage.setItem(CURRENT_KEY, current.id); else localStorage.removeItem(CURRENT_KEY);
    renderList();
    renderLog();
    showTab("chat");
  }
  async function removeConversation(id) {
    if (busy && busy.conv.id === id) return;
    await store.remove(id);
    conversations = conversations.filter((c) => c.id !== id);
    if (current && current.id === id) select(conversations.length ? conversations[0].id : null);
    else renderList();
  }

  // ---- the API -------------------------------------------------------------------------
  function headers() {
    const h = { "Content-Type": "application/json" };
    if (settings.api_key) h.Authorization = "Bearer " + settings.api_key;
    return h;
  }
  async function errorText(r) {
    try { const j = await r.json(); if (j.error && j.error.message) return j.error.message; } catch (_) { /* not JSON */ }
    return `${r.status} ${r.statusText}`;
  }

  function requestBody(conv, answer) {
    const messages = [];
    if (settings.system.trim()) messages.push({ role: "system", content: settings.system });
    for (const m of conv.messages) {
      if (m === answer) break;
      if (m.role === "assistant" && !m.content) continue;  // a failed answer is not history
      messages.push({ role: m.role, content: m.content });
    }
    const body = {
      model: settings.model || undefined, messages, stream: true, stream_options: { include_usage: true },
      temperature: Number(settings.temperature), top_p: Number(settings.top_p), max_tokens: Number(settings.max_tokens),
    };
    if (settings.seed !== "" && settings.seed != null) body.seed = Number(settings.seed);
    return body;
  }

  // Streams one answer into a new assistant message of `conv`.
  async function generate(conv) {
    const msg = { role: "assistant", content: "", stats: {} };
    conv.messages.push(msg);
    const controller = new AbortController();
    busy = { controller, conv, msg };
    setBusy(true);
    renderLog();
    const t0 = performance.now();
    let first = 0, chunks = 0, usage = null;
    try {
      const r = await fetch("v1/chat/completions", {
        method: "POST", headers: headers(), body: JSON.stringify(requestBody(conv, msg)), signal: controller.signal,
      });
      if (!r.ok) throw new Error(await errorText(r));
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const event = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          for (const line of event.split("\n")) {
            if (!line.startsWith("data:")) continue;
            const data = line.slice(5).trim();
            if (data === "[DONE]") continue;
            const j = JSON.parse(data);
            if (j.error) throw new Error(j.error.message || "the server ended the answer");
            if (j.usage) usage = j.usage;
            for (const c of j.choices || []) {
              if (c.delta && c.delta.content) {
                if (!first) first = performance.now();
                chunks += 1;
                msg.content += c.delta.content;
                paintStreaming();
              }
              if (c.finish_reason) msg.stats.finish = c.finish_reason;
            }
          }
        }
      }
    } catch (e) {
      if (e.name === "AbortError") msg.stats.stopped = true;
      else msg.error = e.message || String(e);
    } finally {
      const t1 = performance.now();
      const tokens = usage ? usage.completion_tokens : chunks;
      Object.assign(msg.stats, {
        tokens, exact: !!usage, prompt_tokens: usage ? usage.prompt_tokens : undefined,
        ttft: first ? (first - t0) / 1000 : null,
        tps: first && tokens > 1 && t1 > first ? (tokens - 1) / ((t1 - first) / 1000) : null,
      });
      busy = null;
      setBusy(false);
      await save(conv);
      if (current === conv) renderLog();
      $("input").focus();
    }
  }

  async function send(text) {
    if (busy) return;
    if (!current) {
      current = { id: newId(), title: titleOf(text), created: Date.now(), updated: Date.now(), messages: [] };
      localStorage.setItem(CURRENT_KEY, current.id);
    }
    current.messages.push({ role: "user", content: text });
    await save(current);
    await generate(current);
  }
  async function regenerate() {
    if (busy || !current) return;
    const last = current.messages[current.messages.length - 1];
    if (last && last.role === "assistant") current.messages.pop();
    await generate(current);
  }
  function startEdit(view, i) {
    if (busy) return;
    const m = current.messages[i];
    const box = el("div", "edit");
    const area = el("textarea");
    area.value = m.content;
    const submit = button("Save & send", async () => {
      const text = area.value.trim();
      if (!text) return;
      current.messages = current.messages.slice(0, i);
      current.messages.push({ role: "user", content: text });
      if (i === 0) current.title = titleOf(text);
      await save(current);
      await generate(current);
    }, "save-edit");
    const cancel = button("Cancel", renderLog, "ghost");
    const row = el("div", "foot");
    row.append(submit, cancel);
    box.append(area, row);
    view.replaceChildren(box);
    area.focus();
  }

  // ---- models and server state ---------------------------------------------------------
  async function loadModels() {
    const select = $("model");
    try {
      const r = await fetch("v1/models", { headers: headers() });
      if (!r.ok) throw new Error(await errorText(r));
      const ids = ((await r.json()).data || []).map((m) => m.id);
      select.textContent = "";
      for (const id of ids) select.append(new Option(id, id));
      if (!ids.includes(settings.model)) settings.model = ids[0] || "";
      select.value = settings.model;
      select.title = "";
    } catch (e) {
      select.textContent = "";
      select.append(new Option("(" + e.message + ")", ""));
      select.title = e.message;
      if (/API key/i.test(e.message)) $("settings").hidden = false;
      setTimeout(loadModels, 3000);
    }
  }
  async function pollHealth() {
    let ok = false;
    try { ok = (await fetch("health", { cache: "no-store" })).ok; } catch (_) { ok = false; }
    $("server-state").className = "dot " + (ok ? "ok" : "bad");
    $("server-state").title = ok ? "server up" : "server unreachable";
  }

  // ---- tabs ----------------------------------------------------------------------------
  function showTab(name) {
    const metrics = name === "metrics";
    $("chat-view").hidden = metrics;
    $("metrics-view").hidden = !metrics;
    $("tab-chat").classList.toggle("active", !metrics);
    $("tab-metrics").classList.toggle("active", metrics);
    if (window.metroMetrics) { if (metrics) window.metroMetrics.start(); else window.metroMetrics.stop(); }
    const hash = metrics ? "#metrics" : "";
    if (location.hash !== hash) history.replaceState(null, "", hash || location.pathname + location.search);
  }

  // ---- wiring --------------------------------------------------------------------------
  function bindSettings() {
    for (const key of ["system", "temperature", "top_p", "max_tokens", "seed", "api_key"]) {
      const input = $(key);
      input.value = settings[key];
      input.addEventListener("change", () => {
        settings[key] = input.value;
        saveSettings();
        if (key === "api_key") loadModels();
      });
    }
    $("model").addEventListener("change", () => { settings.model = $("model").value; saveSettings(); });
    $("toggle-settings").onclick = () => { $("settings").hidden = !$("settings").hidden; };
  }

  async function start() {
    bindSettings();
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = $("input").value.trim();
      if (!text || busy) return;
      $("input").value = "";
      send(text);
    });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("composer").requestSubmit(); }
    });
    document.addEventListener("keydown", (e) => { if (e.key === "Escape" && busy) busy.controller.abort(); });
    $("stop").onclick = () => { if (busy) busy.controller.abort(); };
    $("new-chat").onclick = () => { current = null; localStorage.removeItem(CURRENT_KEY); renderList(); renderLog(); showTab("chat"); $("input").focus(); };
    $("tab-chat").onclick = () => showTab("chat");
    $("tab-metrics").onclick = () => showTab("metrics");

    conversations = (await store.all()).sort((a, b) => b.updated - a.updated);
    const want = localStorage.getItem(CURRENT_KEY);
    current = conversations.find((c) => c.id === want) || null;
    renderList();
    renderLog();
    showTab(location.hash === "#metrics" ? "metrics" : "chat");
    loadModels();
    pollHealth();
    setInterval(pollHealth, 5000);
    document.body.dataset.ready = "1";
  }

  // What the browser test reads: the renderer, and whether the app has started.
  window.metroUI = { renderMarkdown };
  start();
})();
