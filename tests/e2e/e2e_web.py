"""The web UI in a real browser: headless Chromium, driven over WebDriver (tests/e2e/webdriver.py),
chats with the shared server. Screenshots of each stage are written to BUILD/e2e-out/web_ui/."""

import os
import struct
import time

from e2e_util import metrics, request
from webdriver import KEYS, Browser

# Records the JSON bodies the page posts to the chat endpoint, so the test can check what
# history each turn sent.
RECORD_REQUESTS = """
if (!window.__sent) {
  window.__sent = [];
  const real = window.fetch.bind(window);
  window.fetch = (url, opts) => {
    if (String(url).includes('chat/completions') && opts && opts.body) window.__sent.push(JSON.parse(opts.body));
    return real(url, opts);
  };
}
return true;
"""
MESSAGES = "return [...document.querySelectorAll('#log .msg')].map(m => [m.classList[1], " \
           "m.querySelector('.body').innerText, (m.querySelector('.stats') || {}).innerText || ''])"
IDLE = "return document.body.dataset.busy === '0' && document.querySelectorAll('#log .msg').length === arguments[0]"


def out_dir(t):
    d = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(t.metro))), "e2e-out", "web_ui")
    os.makedirs(d, exist_ok=True)
    return d


def shot(b, d, name):
    """A screenshot, checked to be a PNG of the window's size."""
    path = os.path.join(d, name)
    png = b.screenshot(path)
    assert png[:8] == b"\x89PNG\r\n\x1a\n", name
    w, h = struct.unpack(">II", png[16:24])
    assert w >= 1000 and h >= 600 and len(png) > 20000, (name, w, h, len(png))
    return path


def set_field(b, field_id, value):
    """Types a setting into its field (opening the settings panel) and commits it."""
    if b.run("return document.getElementById('settings').hidden"):
        b.click("#toggle-settings")
    b.type(f"#{field_id}", str(value), clear=True)
    b.run(f"document.getElementById('{field_id}').dispatchEvent(new Event('change')); return true")


def ask(b, text, n_after, timeout=120):
    b.type("#input", text + KEYS["enter"])
    b.wait(IDLE, timeout, f"the answer to {text!r}", n_after)
    return b.run(MESSAGES)


def counter(port, name):
    return sum(v for k, v in metrics(port).items() if k == name or k.startswith(name + "{"))


def t_web_ui_in_a_browser(t):
    d = out_dir(t)
    b = Browser(os.path.join(t.tmp, "chromium-profile"))
    try:
        base = f"http://127.0.0.1:{t.port}/"
        b.get(base)
        b.wait("return document.body.dataset.ready === '1'", 30, "the app to start")
        # Settings: the key (the shared server wants one), greedy, short answers.
        set_field(b, "api_key", t.key)
        set_field(b, "temperature", 0)
        set_field(b, "max_tokens", 24)
        b.wait("return document.getElementById('model').value === arguments[0]", 30, "the model list", t.model_name)
        b.click("#toggle-settings")
        b.run(RECORD_REQUESTS)
        b.console()  # drop the 401s of the model list asked before the key was given

        # Two turns: the second carries the first as history.
        m = ask(b, "What is the capital of France?", 2)
        assert [r[0] for r in m] == ["user", "assistant"], m
        assert m[1][1].strip() and "tokens" in m[1][2] and "tokens/s" in m[1][2], m
        m = ask(b, "And what about Germany?", 4)
        sent = b.run("return window.__sent")
        assert len(sent) == 2, sent
        hist = sent[1]["messages"]
        assert [x["role"] for x in hist] == ["user", "assistant", "user"], hist
        assert hist[0]["content"] == "What is the capital of France?" and hist[2]["content"] == "And what about Germany?"
        assert hist[1]["content"].strip() == m[1][1].strip(), (hist[1], m[1])
        assert sent[1]["temperature"] == 0 and sent[1]["max_tokens"] == 24 and sent[1]["model"] == t.model_name
        title = b.text("#conversations .conv.active .name")
        assert title == "What is the capital of France?", title
        shot(b, d, "01-two-turns.png")

        # Stop mid-stream: the partial answer stays, marked, and the server stops the work.
        set_field(b, "max_tokens", 800)
        gone_before = counter(t.port, "metro_client_disconnects_total")
        b.type("#input", "Write a very long story about a train crossing the mountains." + KEYS["enter"])
        b.wait("const m = document.querySelectorAll('#log .msg.assistant .body');"
               "return document.body.dataset.busy === '1' && m.length === 3 && m[2].innerText.length > 20",
               60, "the story to start streaming")
        assert not b.run("return document.getElementById('stop').hidden")
        shot(b, d, "02-streaming.png")
        b.click("#stop")
        b.wait(IDLE, 30, "the stop", 6)
        m = b.run(MESSAGES)
        assert "stopped" in m[5][2] and m[5][1].strip(), m[5]
        n_tokens = int(m[5][2].split(" tokens")[0].lstrip("~"))
        assert 0 < n_tokens < 800, m[5]
        deadline = time.time() + 10
        while counter(t.port, "metro_client_disconnects_total") <= gone_before:
            assert time.time() < deadline, "the server did not see the stopped stream go"
            time.sleep(0.2)
        shot(b, d, "03-stopped.png")

        # A reload keeps the conversation (IndexedDB) and the settings (localStorage).
        b.refresh()
        b.wait("return document.body.dataset.ready === '1'", 30, "the app to restart")
        b.wait(IDLE, 10, "the conversation to come back", 6)
        after = b.run(MESSAGES)
        assert [r[:2] for r in after] == [r[:2] for r in m], (after, m)
        assert after[5][2] == m[5][2], (after[5], m[5])
        assert len(b.find_all("#conversations .conv")) == 1
        shot(b, d, "04-reloaded.png")

        # Regenerate the stopped answer (short this time), then edit the first question.
        set_field(b, "max_tokens", 16)
        b.run(RECORD_REQUESTS)
        b.click("#log .msg:last-child .regen-btn")
        b.wait("return document.body.dataset.busy === '1' || !document.querySelector('#log .msg:last-child .stats')"
               ".innerText.includes('stopped')", 30, "the regeneration to start")
        b.wait(IDLE, 60, "the regenerated answer", 6)
        m = b.run(MESSAGES)
        assert "stopped" not in m[5][2] and m[5][1].strip(), m[5]
        b.click("#log .msg[data-index='0'] .edit-btn")
        b.type("#log .msg[data-index='0'] textarea", "What is the capital of Spain?", clear=True)
        b.click("#log .msg[data-index='0'] .save-edit")
        b.wait(IDLE, 60, "the answer to the edited question", 2)
        sent = b.run("return window.__sent")
        assert [x["content"] for x in sent[-1]["messages"]] == ["What is the capital of Spain?"], sent[-1]
        assert b.text("#conversations .conv.active .name") == "What is the capital of Spain?"

        # A second conversation; the first stays in the sidebar.
        b.click("#new-chat")
        ask(b, "Hello!", 2)
        assert len(b.find_all("#conversations .conv")) == 2

        # Markdown and code are rendered; markup and script links in an answer are not live.
        html = b.run("return window.metroUI.renderMarkdown(arguments[0])",
                     "# Title\n\n```python\nprint('x')\n```\n\n<img src=x onerror=alert(1)>\n\n"
                     "[bad](javascript:alert(1)) [good](https://example.com)")
        assert "<h1" in html and 'class="hljs-' in html, html
        assert "<img" not in html and "&lt;img" in html, html
        assert 'href="javascript' not in html and 'href="https://example.com"' in html, html

        # The metrics view reads /metrics: the tokens this test generated are there.
        b.click("#tab-metrics")
        b.wait("const c = document.querySelector('#cards [data-metric=\"requests finished\"] .v');"
               "return c && Number(c.innerText) > 0", 30, "the metrics cards")
        b.wait("return document.querySelectorAll('#charts canvas').length === 4", 10, "the charts")
        # Rates come from two scrapes: tokens generated while the view is open show as tokens/s.
        t.client.completions.create(model=t.model_name, prompt="Once upon a time", max_tokens=48, temperature=0)
        b.wait("const c = document.querySelector('#cards [data-metric=\"generated tokens/s\"] .v');"
               "return c && Number(c.innerText) > 0", 30, "a generation rate")
        shot(b, d, "05-metrics.png")

        # No script errors and no policy violations on the way.
        errors = [e for e in b.console() if e.get("level") == "SEVERE" and "favicon" not in e.get("message", "")]
        assert not errors, errors
        t.note(f"web UI: two turns, stop, reload, regenerate, edit, metrics in headless Chromium; screenshots in {d}")
    finally:
        b.quit()


def t_web_ui_assets(t):
    """The page and its files come from the binary, revalidated by ETag, under a strict policy."""
    st, h, body = request(t.port, "GET", "/")
    assert st == 200 and h["content-type"].startswith("text/html"), h
    assert "script-src 'self'" in h["content-security-policy"], h
    assert b"http://" not in body and b"https://" not in body  # nothing from elsewhere
    for path in ("/ui/app.js", "/ui/metrics.js", "/ui/app.css", "/ui/vendor/marked.js",
                 "/ui/vendor/highlight.js", "/ui/vendor/highlight.css"):
        st, h, data = request(t.port, "GET", path)
        assert st == 200 and len(data) > 500 and h["etag"].startswith('"'), (path, st, h)
        st2, h2, data2 = request(t.port, "GET", path, headers={"If-None-Match": h["etag"]})
        assert st2 == 304 and data2 == b"", (path, st2)
    st, _, _ = request(t.port, "GET", "/ui/nope.js")
    assert st in (401, 404), st


TESTS = [t_web_ui_assets, t_web_ui_in_a_browser]
