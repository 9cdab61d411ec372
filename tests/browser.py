"""Render a local HTML file in headless Chromium and report what a user's browser would: console
messages, uncaught exceptions, network requests, element boxes, and a PNG screenshot.

It speaks the Chrome DevTools Protocol over a websocket (``websocket-client``) to the Debian
``chromium`` package (``apt-get install chromium``; .ci/run installs it). No browser is downloaded.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError(
        f"no headless browser found (looked for {', '.join(CHROMIUM_NAMES)} on PATH): "
        "install Debian's package with `apt-get install chromium` (.ci/run does)"
    )


@dataclass
class Page:
    console: list[tuple[str, str]] = field(default_factory=list)
    """(level, text) of console API calls and browser log entries (failed loads, security errors)."""
    exceptions: list[str] = field(default_factory=list)
    """Uncaught script exceptions."""
    requests: list[str] = field(default_factory=list)
    """Every URL the page asked for, the page itself included."""
    values: dict[str, Any] = field(default_factory=dict)
    """Results of the ``evaluate`` expressions, by name."""

    @property
    def errors(self) -> list[str]:
        return [text for level, text in self.console if level in ("error", "assert")] + self.exceptions


class _Session:
    def __init__(self, ws_url: str, timeout_s: float) -> None:
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=timeout_s, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        ident = self.next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_for(self, method: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e["method"] == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout_s} s")
            self.events.append(json.loads(self.ws.recv()))

    def drain(self, quiet_s: float) -> None:
        """Collect the events that arrive until none has for ``quiet_s`` seconds."""
        import websocket

        self.ws.settimeout(quiet_s)
        try:
            while True:
                message = json.loads(self.ws.recv())
                if "method" in message:
                    self.events.append(message)
        except websocket.WebSocketTimeoutException:
            pass


def render(
    html_path: str | Path,
    screenshot: str | Path | None = None,
    *,
    evaluate: dict[str, str] | None = None,
    width: int = 1280,
    max_height: int = 16000,
    timeout_s: float = 60.0,
) -> Page:
    """Open ``html_path`` in headless Chromium; return what happened on the page. ``evaluate`` maps
    names to JavaScript expressions run after the load (their JSON values land in ``Page.values``);
    ``screenshot`` saves the whole page (up to ``max_height`` pixels) as a PNG ``width`` pixels wide."""
    url = Path(html_path).resolve().as_uri()
    with _profile_dir() as profile:
        proc = subprocess.Popen(
            [find_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--hide-scrollbars", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", f"--window-size={width},900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + timeout_s
            while not (port_file.is_file() and port_file.read_text().count("\n") >= 1):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"chromium did not start (exit status {proc.poll()})")
                time.sleep(0.05)
            port = int(port_file.read_text().splitlines()[0])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout_s) as response:
                targets = json.loads(response.read())
            target = next(t for t in targets if t.get("type") == "page")
            session = _Session(target["webSocketDebuggerUrl"], timeout_s)
            for domain in ("Page", "Runtime", "Log", "Network"):
                session.call(f"{domain}.enable")
            session.call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1,
                         mobile=False)
            session.call("Page.navigate", url=url)
            session.wait_for("Page.loadEventFired", timeout_s)
            session.drain(0.5)
            page = Page()
            for name, expression in (evaluate or {}).items():
                result = session.call("Runtime.evaluate", expression=f"JSON.stringify({expression})",
                                      returnByValue=True)
                if "exceptionDetails" in result:
                    raise RuntimeError(f"evaluating {name!r} failed: {result['exceptionDetails']}")
                page.values[name] = json.loads(result["result"]["value"])
            if screenshot is not None:
                metrics = session.call("Page.getLayoutMetrics")
                height = min(int(metrics["cssContentSize"]["height"]) + 1, max_height)
                session.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                             mobile=False)
                shot = session.call("Page.captureScreenshot", format="png")
                Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
            session.drain(0.2)
            for event in session.events:
                method, params = event["method"], event.get("params", {})
                if method == "Runtime.consoleAPICalled":
                    text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                    page.console.append((params.get("type", ""), text))
                elif method == "Log.entryAdded":
                    entry = params["entry"]
                    page.console.append((entry.get("level", ""), f"{entry.get('text', '')} {entry.get('url', '')}"))
                elif method == "Runtime.exceptionThrown":
                    details = params["exceptionDetails"]
                    page.exceptions.append(details.get("exception", {}).get("description") or details.get("text", ""))
                elif method == "Network.requestWillBeSent":
                    page.requests.append(params["request"]["url"])
            import websocket

            try:
                session.call("Browser.close")
            except (websocket.WebSocketException, OSError):  # it may close the socket before answering
                pass
            session.ws.close()
            return page
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            # Chromium's helper processes (renderer, utility) share its session and may outlive it for a
            # moment, still writing into the profile: end them all before the profile is removed.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def _profile_dir() -> Iterator[str]:
    """A temporary Chromium profile directory, removed afterwards; removal is retried for a few seconds
    (a helper process that was still exiting can leave a file behind: "Directory not empty")."""
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        yield profile
    finally:
        for attempt in range(50):
            try:
                shutil.rmtree(profile)
                break
            except FileNotFoundError:
                break
            except OSError:
                if attempt == 49:
                    raise
                time.sleep(0.1)
