"""http(s) URLs as inputs, against a local HTTP server the test starts: a web page's main text, a
PDF behind a URL read as a PDF, and one line for every way the network fails."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from summarize.inputs import url as url_module
from summarize.inputs.extract import ExtractionError, extract_text
from test_formats import BOILERPLATE, CHAPTERS, page_html

SLOW_SECONDS = 3.0
BIG_BYTES = 64 << 10


@pytest.fixture
def server(tmp_path: Path, pdf_factory) -> Iterator[str]:
    """The base URL of a local server of a page, a PDF (at a path without a suffix), a slow answer,
    a 404, large bodies with and without a length, and a redirect loop."""
    pdf = pdf_factory(tmp_path / "doc.pdf", [f"{title}\n\n{text}" for title, text in CHAPTERS]).read_bytes()
    routes = {"/page.html": ("text/html; charset=utf-8", page_html().encode()),
              "/report": ("application/pdf", pdf)}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path in routes:
                kind, body = routes[self.path]
                self._answer(200, kind, body)
            elif self.path == "/slow":
                time.sleep(SLOW_SECONDS)
                self._answer(200, "text/plain", b"late")
            elif self.path == "/big-with-length":
                self._answer(200, "text/plain", b"bees " * (BIG_BYTES // 5))
            elif self.path == "/big-streamed":  # no Content-Length: the size is known only by reading
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                for _ in range(BIG_BYTES // 1024):
                    self.wfile.write(b"x" * 1023 + b"\n")
            elif self.path == "/loop":
                self.send_response(302)
                self.send_header("Location", "/loop")
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self._answer(404, "text/plain", b"no such page")

        def _answer(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up first (the timeout and size cases)
                pass

        def log_message(self, *args: object) -> None:  # keep the test output clean
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_page_is_read_for_its_main_text(server: str):
    text = extract_text(f"{server}/page.html")
    assert "Worker bees visit flowers" in text and "## The Hive" in text.split("\n\n")
    assert not any(junk in text for junk in BOILERPLATE)


def test_a_pdf_behind_a_url_is_read_as_a_pdf(server: str):
    text = extract_text(f"{server}/report")
    assert "Bees live in colonies" in text and "%PDF" not in text


def _refused_url() -> str:
    with socket.socket() as s:  # a port that was free a moment ago, with nothing listening on it
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/page.html"


def test_every_network_failure_is_one_line(server: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(url_module, "FETCH_TIMEOUT", 0.5)
    cases = {
        f"{server}/missing": "the server answered HTTP 404 Not Found",
        f"{server}/slow": "no complete answer within 0.5 s",
        f"{server}/loop": "more than 5 redirects",
        _refused_url(): "connection refused",
    }
    for url, message in cases.items():
        with pytest.raises(ExtractionError) as info:
            extract_text(url)
        assert str(info.value) == f"{url}: {message}" or str(info.value).startswith(f"{url}: {message}")
        assert "\n" not in str(info.value)


def test_a_host_that_does_not_resolve_says_so(monkeypatch: pytest.MonkeyPatch):
    def no_such_host(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    with pytest.raises(ExtractionError, match=r"^http://nowhere\.example/x: cannot find the host nowhere\.example \(DNS"):
        extract_text("http://nowhere.example/x")


@pytest.mark.parametrize("path", ["/big-with-length", "/big-streamed"])
def test_a_body_over_the_size_limit_is_refused(server: str, path: str):
    with pytest.raises(ExtractionError, match=r": larger than 16K, the input size limit \(--max-input-size raises it\)$"):
        extract_text(f"{server}{path}", max_bytes=16 << 10)


def test_urls_through_the_cli(server: str, run_cli, tmp_path: Path):
    page, pdf, missing = f"{server}/page.html", f"{server}/report", f"{server}/missing"
    result = run_cli(page, pdf, missing, "--extractive", "-n", "30", "--json")
    assert result.exit_code == 1, result.output  # the batch goes on past the missing page
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["input"] for r in records] == [page, pdf, missing]
    assert all(r["summary"] for r in records[:2]) and not records[2].get("summary")
    assert f"{missing}: the server answered HTTP 404 Not Found" in result.stderr

    out = tmp_path / "out"
    result = run_cli(page, pdf, "-o", str(out), "--extractive", "-n", "30")
    assert result.exit_code == 0, result.output
    port = server.rsplit(":", 1)[1]
    assert sorted(p.name for p in out.iterdir()) == [f"127_0_0_1_{port}_page.summary.md", f"127_0_0_1_{port}_report.summary.md"]
