#include "server/web_ui.h"

namespace metro::server {

namespace {

constexpr std::string_view kHtml = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>metro</title>
<style>
  :root { --fg: #1d2330; --muted: #6b7280; --bg: #f6f7f9; --card: #fff; --accent: #2756d8; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.5 system-ui, sans-serif; color: var(--fg); background: var(--bg);
         display: flex; flex-direction: column; height: 100vh; }
  header { display: flex; gap: 12px; align-items: center; padding: 10px 16px; background: var(--card);
           border-bottom: 1px solid #e3e5ea; flex-wrap: wrap; }
  header b { font-size: 17px; }
  header label { color: var(--muted); font-size: 13px; }
  header input { font: inherit; padding: 3px 6px; width: 7em; }
  #log { flex: 1; overflow-y: auto; padding: 16px; }
  .msg { max-width: 52em; margin: 0 auto 12px; padding: 10px 14px; border-radius: 8px; white-space: pre-wrap;
         background: var(--card); border: 1px solid #e3e5ea; }
  .user { background: #e8eefc; }
  .system { color: var(--muted); font-style: italic; }
  .error { color: #a11; }
  .stats { color: var(--muted); font-size: 12px; margin-top: 4px; }
  form { display: flex; gap: 8px; padding: 12px 16px; background: var(--card); border-top: 1px solid #e3e5ea; }
  textarea { flex: 1; font: inherit; padding: 8px; resize: vertical; min-height: 3em; }
  button { font: inherit; padding: 0 18px; background: var(--accent); color: #fff; border: 0; border-radius: 6px; }
  button:disabled { opacity: .5; }
</style>
</head>
<body>
<header>
  <b>metro</b><span id="model">…</span>
  <label>system <input id="system" style="width:16em" placeholder="optional system prompt"></label>
  <label>temperature <input id="temp" type="number" min="0" max="2" step="0.1" value="0.7"></label>
  <label>max tokens <input id="maxtok" type="number" min="1" value="256"></label>
  <label>API key <input id="key" type="password" placeholder="if required"></label>
  <button id="clear" type="button" style="padding:2px 10px">clear</button>
</header>
<div id="log"></div>
<form id="form">
  <textarea id="input" placeholder="Ask something (Enter sends, Shift+Enter for a new line)"></textarea>
  <button id="send">Send</button>
</form>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const turns = [];
let model = null, busy = false;
$("key").value = localStorage.getItem("metro-key") || "";
$("key").onchange = () => localStorage.setItem("metro-key", $("key").value);
$("clear").onclick = () => { turns.length = 0; $("log").textContent = ""; };

function headers() {
  const h = { "Content-Type": "application/json" };
  if ($("key").value) h["Authorization"] = "Bearer " + $("key").value;
  return h;
}
function add(cls, text) {
  const d = document.createElement("div");
  d.className = "msg " + cls;
  d.textContent = text;
  $("log").appendChild(d);
  $("log").scrollTop = $("log").scrollHeight;
  return d;
}
async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error ? j.error.message : r.statusText);
    model = j.data[0].id;
    $("model").textContent = model;
  } catch (e) {
    $("model").textContent = "(" + e.message + ")";
    setTimeout(loadModel, 2000);
  }
}
async function send(text) {
  busy = true; $("send").disabled = true;
  turns.push({ role: "user", content: text });
  add("user", text);
  const out = add("assistant", "");
  const messages = [];
  if ($("system").value) messages.push({ role: "system", content: $("system").value });
  const body = { model, messages: messages.concat(turns), stream: true,
                 stream_options: { include_usage: true },
                 temperature: Number($("temp").value), max_tokens: Number($("maxtok").value) };
  const t0 = performance.now();
  let first = 0, reply = "", usage = null;
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!r.ok) { const j = await r.json(); throw new Error(j.error ? j.error.message : r.statusText); }
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!ev.startsWith("data: ")) continue;
        const data = ev.slice(6);
        if (data === "[DONE]") continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        if (j.usage) usage = j.usage;
        for (const c of j.choices || []) {
          if (c.delta && c.delta.content) {
            if (!first) first = performance.now();
            reply += c.delta.content;
            out.textContent = reply;
            $("log").scrollTop = $("log").scrollHeight;
          }
        }
      }
    }
    turns.push({ role: "assistant", content: reply });
    const s = document.createElement("div");
    s.className = "stats";
    const total = (performance.now() - t0) / 1000;
    s.textContent = usage ? `${usage.completion_tokens} tokens, first after ${((first - t0) / 1000).toFixed(2)} s, ` +
      `${(usage.completion_tokens / Math.max(total - (first - t0) / 1000, 1e-3)).toFixed(1)} tokens/s` : "";
    out.appendChild(s);
  } catch (e) {
    turns.pop();
    out.classList.add("error");
    out.textContent = reply + (reply ? "\n" : "") + "error: " + e.message;
  } finally {
    busy = false; $("send").disabled = false; $("input").focus();
  }
}
$("form").onsubmit = (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || busy) return;
  $("input").value = "";
  send(text);
};
$("input").onkeydown = (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
};
loadModel();
</script>
</body>
</html>
)HTML";

}  // namespace

std::string_view web_ui_html() { return kHtml; }

}  // namespace metro::server
