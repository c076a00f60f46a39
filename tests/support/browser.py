"""A tiny headless-Chromium driver over the DevTools protocol, for checking what the Prefect UI shows.

It needs only Debian's ``chromium`` and the ``websockets`` package (a Prefect
dependency), so no browser download and no Node. It opens a page, waits for
the single-page app to render (polling the page's text, not sleeping a fixed
time), clicks tabs by their label, and takes screenshots.

    with Browser() as b:
        b.open("http://127.0.0.1:4200/runs/flow-run/ID")
        b.click_text("Artifacts")
        b.wait_for_text("Build summary", timeout=30)
        b.screenshot("docs/ui-flow-run.png")
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)


def find_chromium() -> str | None:
    env = os.environ.get("SHARDFLOW_CHROMIUM")
    for path in ((env,) if env else ()) + CHROMIUM_CANDIDATES:
        if path and os.access(path, os.X_OK):
            return path
    return None


class Browser:
    """One headless Chromium process and one page, driven over the DevTools protocol."""

    def __init__(self, executable: str | None = None, *, width: int = 1400, height: int = 1800) -> None:
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise FileNotFoundError("no Chromium found (apt-get install -y chromium)")
        self.width, self.height = width, height
        self._ids = itertools.count(1)
        self._proc: subprocess.Popen[bytes] | None = None
        self._ws: Any = None
        self._profile = tempfile.mkdtemp(prefix="shardflow-chromium-")

    def __enter__(self) -> "Browser":
        from websockets.sync.client import connect

        self._proc = subprocess.Popen(
            [
                self.executable,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={self._profile}",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--window-size={self.width},{self.height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or len(port_file.read_text().splitlines()) < 2:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("Chromium did not start its DevTools endpoint")
            time.sleep(0.05)
        port = int(port_file.read_text().splitlines()[0])
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            targets = json.loads(resp.read())
        page = next(t for t in targets if t.get("type") == "page")
        self._ws = connect(page["webSocketDebuggerUrl"], max_size=64 << 20, open_timeout=10)
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:
                pass
            self._ws = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        shutil.rmtree(self._profile, ignore_errors=True)

    def call(self, method: str, timeout: float = 30, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (events in between are dropped)."""
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"DevTools command {method} got no answer in {timeout} s")
            msg = json.loads(self._ws.recv(timeout=left))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def text(self) -> str:
        """The page's visible text."""
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def wait_for_text(self, *needles: str, timeout: float = 30) -> str:
        """Poll until every needle is in the page's text; returns the text."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if all(n in text for n in needles):
                return text
            time.sleep(0.25)
        missing = [n for n in needles if n not in text]
        raise AssertionError(f"the page never showed {missing!r} in {timeout} s; it shows:\n{text[:3000]}")

    def click_text(self, label: str, timeout: float = 30) -> None:
        """Click the innermost visible element whose text is exactly ``label`` (waiting for it to appear)."""
        script = (
            "(() => { const want = %s;"
            " const els = [...document.querySelectorAll('body *')]"
            "   .filter(e => e.offsetParent !== null && e.textContent.trim() === want);"
            " const el = els[els.length - 1];"
            " if (!el) return false; el.scrollIntoView(); el.click(); return true; })()"
        ) % json.dumps(label)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.evaluate(script):
                return
            time.sleep(0.25)
        raise AssertionError(f"no clickable {label!r} appeared in {timeout} s; the page shows:\n{self.text()[:3000]}")

    def screenshot(self, path: str | os.PathLike[str], *, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", **params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
