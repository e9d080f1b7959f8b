"""A real browser for the tests: Debian's `chromium`, headless, driven over the Chrome DevTools Protocol.

    with start_browser() as browser:            # or the `browser` fixture of tests/real/conftest.py
        visit = browser.open_page(Path("report.html"))
        assert visit.errors == [] and visit.requests == []
        assert visit.text("#best-score") == "12.3"
        visit.screenshot(tmp_path / "report.png")

`open_page` loads a local file and returns once the page's load event has fired and every request it
started has ended. From then on the visit keeps recording, on each call that talks to the browser:

- `errors`: each `console.error` (Runtime.consoleAPICalled), uncaught exception or unhandled rejection
  (Runtime.exceptionThrown), and error the browser itself logged (Log.entryAdded: a refused script, a
  policy violation); a failed request is not repeated here, it is in `requests`;
- `requests`: the URL of every request the page (or a frame in it) made other than for its own file;
  `data:` and `blob:` URLs, which read what the page already holds, are not requests.

The network is blocked twice, so that a page's request is recorded but never leaves the machine: every
request but the page's own file is failed before it is sent (Fetch.requestPaused), and the browser
resolves no host name and sends through a proxy nobody listens on. Every wait is for an event or a
condition in the page, up to a timeout that ends in `BrowserTimeout` saying what it waited for.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from websockets.sync.client import ClientConnection, connect

__all__ = [
    "Browser",
    "BrowserError",
    "BrowserTimeout",
    "PageError",
    "PageVisit",
    "chromium_path",
    "start_browser",
]

DEFAULT_TIMEOUT_S = 30.0  # one step (start, load, evaluate): generous for a loaded 2-core machine
VIEWPORT = (1280, 800)

# The flags beyond headless: no first-run work, no background traffic of the browser's own (updates,
# sync, metrics), no sandbox (it needs user namespaces a container may refuse, and the page is our own
# file), a small /dev/shm tolerated. The last two block the network: no host name resolves, and
# whatever would still go out goes to a proxy on the discard port, where nothing listens.
_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-breakpad",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,AutofillServerCommunication",
    "--metrics-recording-only",
    "--mute-audio",
    "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)


class BrowserError(RuntimeError):
    """The browser failed to start, or refused a step (a missing file, a script that threw)."""


class BrowserTimeout(BrowserError):
    """A wait ran out; the message says what it waited for."""


@dataclass(frozen=True)
class PageError:
    """One error the page showed in its console: `kind` is console (console.error), exception (uncaught,
    or an unhandled rejection) or log (the browser's own: a refused script, a policy violation)."""

    kind: str
    text: str
    where: str = ""  # url:line where the browser says

    def __str__(self) -> str:
        return f"{self.kind}: {self.text}" + (f" ({self.where})" if self.where else "")


def chromium_path() -> Path | None:
    """Debian's chromium on PATH, or None."""
    found = shutil.which("chromium")
    return Path(found) if found else None


class _Connection:
    """The browser's DevTools websocket: commands by id, events handed to the page they belong to."""

    def __init__(self, url: str) -> None:
        # proxy=None: the websocket is on loopback, whatever proxy the environment names
        self._ws: ClientConnection = connect(url, max_size=None, proxy=None, open_timeout=DEFAULT_TIMEOUT_S).__enter__()
        self._ids = itertools.count(1)
        self._replies: dict[int, dict[str, Any]] = {}
        self.handlers: dict[str, Callable[[str, dict[str, Any]], None]] = {}  # session id -> handler

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None) -> int:
        """Sends a command without waiting for its reply (what an event handler may do)."""
        message_id = next(self._ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self._ws.send(json.dumps(message))
        return message_id

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> dict[str, Any]:
        message_id = self.send(method, params, session=session)
        deadline = time.monotonic() + timeout
        self.pump_until(lambda: message_id in self._replies, deadline, f"the browser's reply to {method}")
        reply = self._replies.pop(message_id)
        if "error" in reply:
            raise BrowserError(f"{method} failed: {reply['error'].get('message', reply['error'])}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    def pump_until(self, done: Callable[[], bool], deadline: float, what: str) -> None:
        """Reads messages, replies and events, until `done()` holds; past the deadline, BrowserTimeout."""
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserTimeout(f"timed out waiting for {what}")
            try:
                raw = self._ws.recv(timeout=left)
            except TimeoutError:
                continue
            message = json.loads(raw)
            if "id" in message:
                self._replies[message["id"]] = message
            elif (handler := self.handlers.get(message.get("sessionId", ""))) is not None:
                handler(message["method"], message.get("params", {}))

    def close(self) -> None:
        self._ws.__exit__(None, None, None)


@dataclass
class PageVisit:
    """One page open in the browser, recording what it does (see the module's docstring)."""

    url: str
    errors: list[PageError] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    _connection: _Connection | None = field(default=None, repr=False)
    _session: str = field(default="", repr=False)
    _target: str = field(default="", repr=False)
    _loaded: bool = field(default=False, repr=False)
    _pending: set[str] = field(default_factory=set, repr=False)  # ids of requests not yet ended

    # ---- what the page shows ----------------------------------------------------------------------

    def evaluate(self, expression: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        """The value of a JavaScript expression in the page (awaited if it is a promise), as JSON would
        carry it; an expression that throws raises BrowserError with the page's message."""
        result = self._call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True, "userGesture": True},
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            raise BrowserError(f"{expression!r} threw in the page: {text}")
        return result["result"].get("value")

    def texts(self, selector: str) -> list[str]:
        """The rendered text (innerText) of each element the CSS selector matches, in document order."""
        found = self.evaluate(
            f"Array.from(document.querySelectorAll({json.dumps(selector)}), e => e.innerText)",
        )
        assert isinstance(found, list)
        return [str(text) for text in found]

    def text(self, selector: str) -> str:
        """The rendered text of the one element the selector matches; none or several is an error."""
        found = self.texts(selector)
        if len(found) != 1:
            raise BrowserError(f"{selector!r} matches {len(found)} elements in {self.url}, not one")
        return found[0]

    def wait_for(self, condition: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Waits until a JavaScript expression is truthy in the page (checked on every animation frame and
        whenever the page changes); BrowserTimeout names the condition."""
        script = (
            "new Promise(resolve => { let observer = null; function check() { if (!(" + condition + ")) return "
            "false; if (observer) observer.disconnect(); resolve(true); return true; } if (check()) return; "
            "observer = new MutationObserver(check); observer.observe(document, {subtree: true, childList: true, "
            "attributes: true, characterData: true}); function frame() { if (!check()) requestAnimationFrame(frame); } "
            "requestAnimationFrame(frame); })"
        )
        try:
            self.evaluate(script, timeout=timeout)
        except BrowserTimeout:
            raise BrowserTimeout(f"timed out after {timeout} s waiting for {condition!r} in {self.url}") from None

    def screenshot(self, path: Path) -> Path:
        """Saves a PNG of the whole page, beyond the window's height, at `path`; returns the path."""
        metrics = self._call("Page.getLayoutMetrics")
        size = metrics["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        shot = self._call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(BrowserError):
                self._connection.call("Target.closeTarget", {"targetId": self._target})
            self._connection.handlers.pop(self._session, None)
            self._connection = None

    def __enter__(self) -> PageVisit:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---- the protocol -----------------------------------------------------------------------------

    def _call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        if self._connection is None:
            raise BrowserError(f"the visit of {self.url} is closed")
        return self._connection.call(method, params, session=self._session, timeout=timeout)

    def _on_event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Page.loadEventFired":
            self._loaded = True
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(_remote_text(arg) for arg in params.get("args", []))
            self.errors.append(PageError("console", text, _where(params.get("stackTrace"))))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            # "Uncaught" or "Uncaught (in promise)", then the error and its stack as the console shows them
            text = " ".join(
                part for part in (details.get("text"), details.get("exception", {}).get("description")) if part
            )
            where = f"{details.get('url', '')}:{details.get('lineNumber', 0) + 1}" if details.get("url") else ""
            self.errors.append(PageError("exception", text, where))
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            # A failed request is logged too ("Failed to load resource"); `requests` already has it.
            if entry.get("level") == "error" and entry.get("source") != "network":
                where = f"{entry['url']}:{entry.get('lineNumber', 0) + 1}" if entry.get("url") else ""
                self.errors.append(PageError("log", entry.get("text", ""), where))
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            if url != self.url and not url.startswith(("data:", "blob:")):
                self.requests.append(url)
                self._pending.add(params["requestId"])
        elif method in ("Network.loadingFinished", "Network.loadingFailed"):
            self._pending.discard(params.get("requestId", ""))
        elif method == "Fetch.requestPaused" and self._connection is not None:
            # The page's own file goes on; anything else fails before it is sent.
            if params["request"]["url"] == self.url:
                self._connection.send(
                    "Fetch.continueRequest", {"requestId": params["requestId"]}, session=self._session
                )
            else:
                self._connection.send(
                    "Fetch.failRequest",
                    {"requestId": params["requestId"], "errorReason": "BlockedByClient"},
                    session=self._session,
                )


def _remote_text(arg: dict[str, Any]) -> str:
    """A console argument as the console shows it."""
    if "value" in arg:
        value = arg["value"]
        return value if isinstance(value, str) else json.dumps(value)
    return str(arg.get("description") or arg.get("unserializableValue") or arg.get("type", ""))


def _where(stack: dict[str, Any] | None) -> str:
    frames = (stack or {}).get("callFrames") or []
    if not frames:
        return ""
    return f"{frames[0].get('url', '')}:{frames[0].get('lineNumber', 0) + 1}"


class Browser:
    """A running headless chromium; `open_page` opens each page in a fresh tab. Use `start_browser`."""

    def __init__(self, process: subprocess.Popen[bytes], connection: _Connection, log: Path) -> None:
        self._process = process
        self._connection = connection
        self._log = log
        self._visits: list[PageVisit] = []

    def open_page(
        self,
        path: Path,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        viewport: tuple[int, int] = VIEWPORT,
        intercept: bool = True,
    ) -> PageVisit:
        """Opens a local HTML file; returns once it has loaded and every request it started has ended.

        `intercept=False` leaves the network to the browser's own block alone (the harness's self-test
        checks that it holds by itself)."""
        if not path.is_file():
            raise BrowserError(f"{path} is not a file")
        deadline = time.monotonic() + timeout
        url = path.resolve().as_uri()
        target = self._connection.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self._connection.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        visit = PageVisit(url=url, _connection=self._connection, _session=session, _target=target)
        self._connection.handlers[session] = visit._on_event
        self._visits.append(visit)
        width, height = viewport
        if intercept:
            visit._call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]})
        for method, params in (
            ("Network.enable", {}),
            ("Runtime.enable", {}),
            ("Log.enable", {}),
            ("Page.enable", {}),
            (
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            ),
        ):
            visit._call(method, params)
        navigated = visit._call("Page.navigate", {"url": url})
        if navigated.get("errorText"):
            raise BrowserError(f"chromium could not open {url}: {navigated['errorText']}")
        self._connection.pump_until(lambda: visit._loaded, deadline, f"the load event of {url}")
        self._connection.pump_until(
            lambda: not visit._pending,
            deadline,
            f"the requests of {url} to end (still open: {len(visit._pending)})",
        )
        # A rejection nobody handled is reported after the task that made it; one frame and one task later,
        # what the loading scripts did has all been reported (the events come in order, before the reply).
        visit.evaluate("new Promise(resolve => requestAnimationFrame(() => setTimeout(resolve, 0)))", timeout=timeout)
        return visit

    def close(self) -> None:
        for visit in self._visits:
            visit.close()
        with contextlib.suppress(Exception):
            self._connection.call("Browser.close", timeout=10)
        with contextlib.suppress(Exception):
            self._connection.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)


@contextlib.contextmanager
def start_browser(executable: Path | None = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> Iterator[Browser]:
    """Starts headless chromium with a throwaway profile; closes it and removes the profile on exit."""
    binary = executable or chromium_path()
    if binary is None:
        raise BrowserError("chromium is not on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="serve-tuner-chromium-") as scratch:
        profile, log_path = Path(scratch) / "profile", Path(scratch) / "chromium.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(binary), *_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            url = _devtools_url(process, profile / "DevToolsActivePort", log_path, timeout)
            browser = Browser(process, _Connection(url), log_path)
        except BaseException:
            process.kill()
            process.wait(timeout=10)
            raise
        try:
            yield browser
        finally:
            browser.close()


def _devtools_url(process: subprocess.Popen[bytes], port_file: Path, log: Path, timeout: float) -> str:
    """The browser's DevTools websocket, from the DevToolsActivePort file chromium writes once listening."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            port, ws_path = port_file.read_text().split("\n")[:2]
            if port and ws_path:
                return f"ws://127.0.0.1:{int(port)}{ws_path}"
        except (OSError, ValueError):
            pass  # not written yet, or half written
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise BrowserError(f"chromium exited with status {process.returncode} before listening:\n{tail}")
        if time.monotonic() > deadline:
            raise BrowserTimeout(f"timed out after {timeout} s waiting for chromium to write {port_file.name}")
        time.sleep(0.05)
