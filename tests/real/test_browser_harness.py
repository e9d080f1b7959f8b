"""The browser harness (tests/support/browser.py) can fail: a page's errors and requests are reported, exactly those,
a clean page reports none, nothing a page asks for leaves the machine, and the screenshot is a whole PNG."""

from __future__ import annotations

import socket
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.browser import Browser, BrowserError, BrowserTimeout

# A host no resolver knows (.invalid is reserved), so that even a browser that ignored both blocks would
# send nothing anywhere.
ELSEWHERE = "https://reports.example.invalid/beacon?run=1"


class _Listener:
    """A TCP port on loopback that counts the connections made to it (a request that got out)."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._socket.getsockname()[1])
        self.connections = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return  # shut down
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self._socket.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone would not)
        self._thread.join(timeout=10)
        self._socket.close()


@pytest.fixture
def listener() -> Iterator[_Listener]:
    running = _Listener()
    try:
        yield running
    finally:
        running.close()


def _page(tmp_path: Path, name: str, body: str, head: str = "") -> Path:
    path = tmp_path / name
    path.write_text(
        f'<!doctype html>\n<html><head><meta charset="utf-8">{head}</head>\n<body>\n{body}\n</body></html>\n'
    )
    return path


def _requesting_page(tmp_path: Path, port: int) -> Path:
    return _page(
        tmp_path,
        "dirty.html",
        '<p id="total">42</p>\n'
        f'<img src="http://127.0.0.1:{port}/pixel.png" alt="">\n'
        "<script>\n"
        'console.log("a log line is no error");\n'
        'console.error("boom", 42);\n'
        f'fetch("{ELSEWHERE}").catch(() => {{ document.body.dataset.fetch = "failed"; }});\n'
        "</script>",
    )


def test_a_page_s_console_error_and_requests_are_reported_exactly(
    browser: Browser, tmp_path: Path, listener: _Listener
) -> None:
    page = _requesting_page(tmp_path, listener.port)
    with browser.open_page(page) as visit:
        visit.wait_for('document.body.dataset.fetch === "failed"')  # the fetch was refused, not answered
        assert [(error.kind, error.text) for error in visit.errors] == [("console", "boom 42")]
        assert visit.errors[0].where == f"{page.as_uri()}:8"  # the console.error line
        assert sorted(visit.requests) == sorted([ELSEWHERE, f"http://127.0.0.1:{listener.port}/pixel.png"])
        assert visit.text("#total") == "42"
    assert listener.connections == 0  # recorded, and blocked before it was sent


def test_the_browser_s_own_block_holds_without_the_interception(
    browser: Browser, tmp_path: Path, listener: _Listener
) -> None:
    """The second guard alone: no host name resolves, and the rest goes to a proxy nobody listens on."""
    with browser.open_page(_requesting_page(tmp_path, listener.port), intercept=False) as visit:
        visit.wait_for('document.body.dataset.fetch === "failed"')
        assert sorted(visit.requests) == sorted([ELSEWHERE, f"http://127.0.0.1:{listener.port}/pixel.png"])
    assert listener.connections == 0


def test_uncaught_exceptions_and_unhandled_rejections_are_errors(browser: Browser, tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "throws.html",
        '<script>Promise.reject(new Error("nobody waits for this"));</script>\n'
        '<script>throw new TypeError("kaput");</script>\n<p id="after">still here</p>',
    )
    with browser.open_page(page) as visit:
        assert sorted((error.kind, error.text.splitlines()[0]) for error in visit.errors) == [
            ("exception", "Uncaught (in promise) Error: nobody waits for this"),
            ("exception", "Uncaught TypeError: kaput"),
        ]
        assert visit.requests == []
        assert visit.text("#after") == "still here"


def test_the_browser_s_own_errors_are_errors(browser: Browser, tmp_path: Path) -> None:
    """A script the page's policy refuses never runs, and the browser logs why (Log.entryAdded)."""
    policy = '<meta http-equiv="Content-Security-Policy" content="script-src \'none\'">'
    page = _page(tmp_path, "refused.html", '<script>document.title = "ran";</script>', head=policy)
    with browser.open_page(page) as visit:
        assert [error.kind for error in visit.errors] == ["log"]
        assert "Content Security Policy" in visit.errors[0].text
        assert visit.evaluate("document.title") == ""


def test_a_clean_page_reports_nothing(browser: Browser, tmp_path: Path) -> None:
    # Styles, a script and an inline image: what a self-contained report holds, none of it a request.
    pixel = (
        "data:image/png;base64,"
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
    )
    page = _page(
        tmp_path,
        "clean.html",
        f'<h1>Report</h1>\n<img src="{pixel}" alt="">\n<ul><li>1.5</li><li>2.25</li></ul>\n<p id="total"></p>\n'
        '<script>document.getElementById("total").textContent = String(1.5 + 2.25);</script>',
        head="<style>h1 { color: #333; }</style>",
    )
    with browser.open_page(page) as visit:
        assert visit.errors == [] and visit.requests == []
        assert visit.texts("li") == ["1.5", "2.25"]
        assert visit.text("#total") == "3.75"
        assert visit.evaluate("document.images[0].naturalWidth") == 1


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG, after checking every chunk's CRC and that the pixels decompress to
    exactly the rows the header promises (8-bit RGB or RGBA, as chromium writes them)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    offset, chunks, pixels = 8, [], b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind, body = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        chunks.append(kind)
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            pixels += body
        offset += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND"
    assert depth == 8 and colour in (2, 6)
    channels = 3 if colour == 2 else 4
    assert len(zlib.decompress(pixels)) == height * (1 + width * channels)
    return width, height


def test_the_screenshot_is_a_png_of_the_whole_page(browser: Browser, tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "tall.html",
        '<div style="height: 3000px; background: #4a7">tall</div>',
        "<style>body { margin: 0 }</style>",
    )
    with browser.open_page(page, viewport=(1024, 600)) as visit:
        shot = visit.screenshot(tmp_path / "shots" / "tall.png")
    assert shot == tmp_path / "shots" / "tall.png" and shot.stat().st_size > 0
    assert _png_size(shot.read_bytes()) == (1024, 3000)  # beyond the 600-pixel window


def test_waits_end_in_errors_that_say_what_they_waited_for(browser: Browser, tmp_path: Path) -> None:
    with browser.open_page(_page(tmp_path, "still.html", "<p>nothing happens</p>")) as visit:
        with pytest.raises(BrowserTimeout, match=r"window\.never === true"):
            visit.wait_for("window.never === true", timeout=0.5)
        visit.evaluate("setTimeout(() => { window.later = 1; }, 50)")
        visit.wait_for("window.later === 1")
        with pytest.raises(BrowserError, match="nope"):
            visit.evaluate('(() => { throw new Error("nope"); })()')
        with pytest.raises(BrowserError, match="matches 0 elements"):
            visit.text("#absent")
        assert visit.errors == []  # what the test's own evaluate threw is not the page's error
    with pytest.raises(BrowserError, match="is not a file"):
        browser.open_page(tmp_path / "missing.html")
