"""A small W3C WebDriver client over chromedriver and headless Chromium (Debian's `chromium`
and `chromium-driver`), enough to drive metro's web UI from the e2e tests: open a page,
find elements, type, click, run a script, take a screenshot, read the console."""

import base64
import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C element reference key
KEYS = {"enter": "\ue007", "escape": "\ue00c", "shift": "\ue008"}


def find_browser():
    """(chromium, chromedriver) paths, or raise naming the packages that provide them."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        raise RuntimeError("headless Chromium and chromedriver are needed: scripts/deps.sh --test "
                           "(apt-get install chromium chromium-driver)")
    return chromium, driver


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDriverError(RuntimeError):
    pass


class Browser:
    def __init__(self, profile_dir, width=1280, height=860):
        chromium, driver = find_browser()
        self.port = free_port()
        self.proc = subprocess.Popen([driver, f"--port={self.port}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.sid = None
        deadline = time.time() + 20
        while True:
            try:
                if self._call("GET", "/status", session=False).get("ready"):
                    break
            except (OSError, WebDriverError):
                pass
            if time.time() > deadline:
                self.proc.kill()
                raise RuntimeError("chromedriver did not start")
            time.sleep(0.1)
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", f"--window-size={width},{height}",
                f"--user-data-dir={profile_dir}"]
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {"binary": chromium, "args": args}}}}
        value = self._call("POST", "/session", caps, session=False)
        self.sid = value["sessionId"]

    def _call(self, method, path, body=None, session=True, timeout=60):
        url = f"http://127.0.0.1:{self.port}" + (f"/session/{self.sid}" if session else "") + path
        data = json.dumps(body if body is not None else {}).encode() if method == "POST" else None
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read() or b"{}").get("value")
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            raise WebDriverError(f"{method} {path}: {e.code} {detail[:500]}") from None

    # ---- pages and scripts ---------------------------------------------------------------
    def get(self, url):
        self._call("POST", "/url", {"url": url})

    def refresh(self):
        self._call("POST", "/refresh")

    def run(self, script, *args):
        """Runs `script` (a function body; `return` gives the value) in the page."""
        return self._call("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait(self, script, timeout=60, what=None, *args):
        """Polls `script` until it returns something truthy; returns it."""
        deadline = time.time() + timeout
        while True:
            value = self.run(script, *args)
            if value:
                return value
            if time.time() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what or script}")
            time.sleep(0.1)

    # ---- elements --------------------------------------------------------------------------
    def find(self, css):
        return self._call("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def find_all(self, css):
        return [e[ELEMENT] for e in self._call("POST", "/elements", {"using": "css selector", "value": css})]

    def click(self, css):
        self._call("POST", f"/element/{self.find(css)}/click")

    def type(self, css, text, clear=False):
        el = self.find(css)
        if clear:
            self._call("POST", f"/element/{el}/clear")
        self._call("POST", f"/element/{el}/value", {"text": text})

    def text(self, css):
        return self._call("GET", f"/element/{self.find(css)}/text")

    # ---- artifacts -------------------------------------------------------------------------
    def screenshot(self, path):
        png = base64.b64decode(self._call("GET", "/screenshot"))
        with open(path, "wb") as f:
            f.write(png)
        return png

    def console(self):
        """The browser console's entries since the last call (chromedriver's log endpoint)."""
        try:
            return self._call("POST", "/se/log", {"type": "browser"}) or []
        except WebDriverError:
            return []

    def quit(self):
        try:
            if self.sid:
                self._call("DELETE", "", timeout=10)
        except (OSError, WebDriverError):
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
