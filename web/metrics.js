"use strict";
// The Metrics view: the server's /metrics scraped every 2 s while the view is open, shown as
// cards (now) and charts (the last five minutes). Families with a `model` label are summed
// over models; rates and percentiles come from the difference of two scrapes.
(() => {
  const $ = (id) => document.getElementById(id);
  const PERIOD_MS = 2000;
  const HISTORY = 150;         // points per chart: five minutes at 2 s
  const RATE_WINDOW_S = 10;    // tokens/s over the last 10 s
  const QUANTILE_WINDOW_S = 60;

  // Prometheus text format -> Map(name -> [{labels, value}]).
  function parse(text) {
    const out = new Map();
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const labels = {};
      if (m[2]) for (const p of m[2].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[p[1]] = p[2];
      const value = m[3] === "+Inf" ? Infinity : m[3] === "-Inf" ? -Infinity : Number(m[3]);
      if (!out.has(m[1])) out.set(m[1], []);
      out.get(m[1]).push({ labels, value });
    }
    return out;
  }
  const total = (m, name) => (m.get(name) || []).reduce((a, s) => a + s.value, 0);
  const maxOf = (m, name) => (m.get(name) || []).reduce((a, s) => Math.max(a, s.value), 0);
  const has = (m, name) => m.has(name);

  // Cumulative bucket counts by upper bound, summed over every other label.
  function buckets(m, name) {
    const b = new Map();
    for (const s of m.get(name + "_bucket") || []) {
      const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
      b.set(le, (b.get(le) || 0) + s.value);
    }
    return b;
  }
  // The q-quantile of the observations made between two scrapes (then may be null: all of
  // them), interpolated inside its bucket as Prometheus' histogram_quantile does.
  function quantile(q, name, now, then) {
    const a = buckets(now, name);
    const b = then ? buckets(then, name) : new Map();
    const les = [...a.keys()].sort((x, y) => x - y);
    if (!les.length) return null;
    const count = (le) => a.get(le) - (b.get(le) || 0);
    const n = count(les[les.length - 1]);
    if (!(n > 0)) return null;
    const target = q * n;
    let lower = 0, below = 0;
    for (const le of les) {
      const c = count(le);
      if (c >= target) {
        if (le === Infinity) return lower;
        return lower + (le - lower) * ((target - below) / Math.max(c - below, 1e-9));
      }
      lower = le;
      below = c;
    }
    return lower;
  }

  const scrapes = [];  // { t (s), m }
  const series = { tokens: [], queue: [], kv: [], ttft: [] };
  let timer = null;

  function scrapeAgo(seconds) {
    const last = scrapes[scrapes.length - 1];
    for (let i = scrapes.length - 2; i >= 0; i--) if (last.t - scrapes[i].t >= seconds) return scrapes[i];
    return scrapes.length > 1 ? scrapes[0] : null;
  }
  function rate(name, seconds) {
    const now = scrapes[scrapes.length - 1], then = scrapeAgo(seconds);
    if (!then || now.t <= then.t) return null;
    return Math.max(0, total(now.m, name) - total(then.m, name)) / (now.t - then.t);
  }
  const fmt = (v, digits = 1) => (v == null || !isFinite(v) ? "—" : v.toFixed(digits));
  const ms = (v) => (v == null ? "—" : v < 1 ? `${(v * 1000).toFixed(0)} ms` : `${v.toFixed(2)} s`);

  function card(key, value, note) {
    const c = document.createElement("div");
    c.className = "card";
    const k = document.createElement("div"); k.className = "k"; k.textContent = key;
    const v = document.createElement("div"); v.className = "v"; v.textContent = value;
    c.append(k, v);
    if (note) { const n = document.createElement("div"); n.className = "k"; n.textContent = note; c.append(n); }
    c.dataset.metric = key;
    return c;
  }

  function latency(name) {
    const now = scrapes[scrapes.length - 1].m, then = scrapeAgo(QUANTILE_WINDOW_S);
    let p50 = then ? quantile(0.5, name, now, then.m) : null, p99 = then ? quantile(0.99, name, now, then.m) : null;
    let note = `last ${QUANTILE_WINDOW_S} s`;
    if (p50 == null) { p50 = quantile(0.5, name, now, null); p99 = quantile(0.99, name, now, null); note = "since start"; }
    return { text: `${ms(p50)} / ${ms(p99)}`, p99, note: `p50 / p99, ${note}` };
  }

  function render() {
    const m = scrapes[scrapes.length - 1].m;
    const gen = rate("metro_generation_tokens_total", RATE_WINDOW_S);
    const prompt = rate("metro_prompt_tokens_total", RATE_WINDOW_S);
    const steps = rate("metro_engine_steps_total", RATE_WINDOW_S);
    const batch = steps ? (gen + prompt) / steps : null;
    const running = total(m, "metro_requests_running"), waiting = total(m, "metro_requests_waiting");
    const kv = has(m, "metro_kv_usage_ratio") ? maxOf(m, "metro_kv_usage_ratio") : null;
    const queries = total(m, "metro_prefix_cache_queries_total");
    const hits = total(m, "metro_prefix_cache_hits_total");
    const ttft = latency("metro_time_to_first_token_seconds");
    const tpot = latency("metro_time_per_output_token_seconds");
    const up = has(m, "process_start_time_seconds") ? Date.now() / 1000 - total(m, "process_start_time_seconds") : null;

    const cards = $("cards");
    cards.replaceChildren(
      card("running", String(running)),
      card("waiting", String(waiting)),
      card("KV cache use", kv == null ? "—" : `${(kv * 100).toFixed(1)} %`),
      card("generated tokens/s", fmt(gen), `last ${RATE_WINDOW_S} s`),
      card("prompt tokens/s", fmt(prompt), `last ${RATE_WINDOW_S} s`),
      card("tokens per step", fmt(batch), `last ${RATE_WINDOW_S} s`),
      card("time to first token", ttft.text, ttft.note),
      card("time per output token", tpot.text, tpot.note),
      card("prefix cache hits", queries > 0 ? `${((hits / queries) * 100).toFixed(1)} %` : "—", "of prompt tokens"),
      card("requests finished", String(total(m, "metro_requests_finished_total"))),
      card("uptime", up == null ? "—" : up < 3600 ? `${(up / 60).toFixed(1)} min` : `${(up / 3600).toFixed(1)} h`),
    );

    const push = (arr, v) => { arr.push(v == null || !isFinite(v) ? 0 : v); if (arr.length > HISTORY) arr.shift(); };
    push(series.tokens, gen);
    push(series.queue, running + waiting);
    push(series.kv, kv == null ? 0 : kv * 100);
    const prev = scrapes.length > 1 ? scrapes[scrapes.length - 2].m : null;
    push(series.ttft, prev ? (quantile(0.99, "metro_time_to_first_token_seconds", m, prev) || 0) * 1000 : 0);
    drawCharts();
  }

  const CHARTS = [
    { key: "tokens", title: "generated tokens/s" },
    { key: "queue", title: "requests running + waiting" },
    { key: "kv", title: "KV cache use, %" },
    { key: "ttft", title: "TTFT p99 per scrape, ms" },
  ];
  function drawCharts() {
    const box = $("charts");
    if (!box.children.length) {
      for (const c of CHARTS) {
        const d = document.createElement("div");
        d.className = "chart";
        d.innerHTML = `<div class="k"><span></span><span class="now"></span></div><canvas></canvas>`;
        d.querySelector("span").textContent = c.title;
        d.dataset.key = c.key;
        box.append(d);
      }
    }
    for (const d of box.children) {
      const data = series[d.dataset.key];
      const canvas = d.querySelector("canvas");
      const w = canvas.clientWidth || 320, h = canvas.clientHeight || 90, r = window.devicePixelRatio || 1;
      canvas.width = w * r; canvas.height = h * r;
      const g = canvas.getContext("2d");
      g.scale(r, r);
      g.clearRect(0, 0, w, h);
      const top = Math.max(1e-9, ...data);
      d.querySelector(".now").textContent = `now ${fmt(data[data.length - 1])} · max ${fmt(top)}`;
      g.strokeStyle = "#e3e5ea";
      g.beginPath(); g.moveTo(0, h - 0.5); g.lineTo(w, h - 0.5); g.stroke();
      if (data.length < 2) continue;
      g.strokeStyle = "#2756d8";
      g.lineWidth = 1.5;
      g.beginPath();
      data.forEach((v, i) => {
        const x = w - ((data.length - 1 - i) / (HISTORY - 1)) * w, y = h - 4 - (v / top) * (h - 10);
        if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
      });
      g.stroke();
    }
  }

  async function tick() {
    try {
      const r = await fetch("metrics", { cache: "no-store" });
      if (!r.ok) throw new Error(`${r.status} ${r.statusText}`);
      scrapes.push({ t: performance.now() / 1000, m: parse(await r.text()) });
      while (scrapes.length > 2 && scrapes[scrapes.length - 1].t - scrapes[0].t > QUANTILE_WINDOW_S + 2 * PERIOD_MS / 1000) scrapes.shift();
      $("metrics-status").textContent = `updated ${new Date().toLocaleTimeString()}`;
      render();
    } catch (e) {
      $("metrics-status").textContent = `cannot read /metrics: ${e.message}`;
    }
  }

  window.metroMetrics = {
    start() { if (!timer) { tick(); timer = setInterval(tick, PERIOD_MS); } },
    stop() { if (timer) { clearInterval(timer); timer = null; } },
    parse, quantile,
  };
})();
