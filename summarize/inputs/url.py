"""An http(s) URL's bytes, read as a file is: within the input size limit, in FETCH_TIMEOUT seconds
at most, and every way it can fail said in one line naming the URL.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from summarize.errors import first_line
from summarize.inputs.read_bytes import ExtractionError, check_size, read_limited

FETCH_TIMEOUT = 30.0  # seconds for the whole response, not only between two packets
MAX_REDIRECTS = 5
READ_BLOCK = 1 << 16  # one receive at a time, so that the deadline is checked often
MAX_NAME_CHARS = 100  # of the file name a URL's summary is written under
USER_AGENT = "summarize"
_SCHEMES = ("http://", "https://")
_NOT_A_NAME = re.compile(r"[^A-Za-z0-9_]+")


def is_url(source: object) -> bool:
    return isinstance(source, str) and source[:8].lower().startswith(_SCHEMES)


def url_suffix(url: str) -> str:
    """The suffix of the URL's path (".pdf" for http://host/a/report.pdf?x=1), lower case."""
    return PurePosixPath(unquote(urlsplit(url).path)).suffix.lower()


def url_file_name(url: str) -> Path:
    """A file name for what `url` holds: host, port, path and query as one slug without dots (an
    output's name drops the suffix), the path's suffix kept: http://h:8000/a/b.pdf → h_8000_a_b.pdf."""
    parts = urlsplit(url)
    suffix = url_suffix(url)
    path = unquote(parts.path)[: len(unquote(parts.path)) - len(suffix)] if suffix else unquote(parts.path)
    slug = _NOT_A_NAME.sub("_", f"{parts.netloc} {path} {parts.query}").strip("_")[:MAX_NAME_CHARS]
    return Path((slug or "page") + (suffix if suffix.isascii() and suffix[1:].isalnum() else ""))


def read_url(url: str, *, max_bytes: int) -> bytes:
    """The body of `url` (after at most MAX_REDIRECTS redirects); ExtractionError naming the URL for
    a name that does not resolve, a refused or timed-out connection, a TLS failure, an HTTP error
    status, an empty body or one larger than `max_bytes`."""
    deadline = time.monotonic() + FETCH_TIMEOUT
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})
    try:
        with _OPENER.open(request, timeout=FETCH_TIMEOUT) as response:
            length = response.headers.get("Content-Length", "")
            if length.isdigit():  # refused before a byte of the body is read
                check_size(int(length), url, max_bytes)
            data = read_limited(_Deadline(response, deadline, url), url, max_bytes)
    except ExtractionError:
        raise
    except Exception as exc:
        raise ExtractionError(f"{url}: {_why(exc, url)}") from exc
    if not data:
        raise ExtractionError(f"{url}: the page is empty")
    return data


class _Deadline:
    """A response read one receive at a time, failing once past the deadline."""

    def __init__(self, response: http.client.HTTPResponse, deadline: float, url: str) -> None:
        self._response, self._deadline, self._url = response, deadline, url

    def read(self, size: int) -> bytes:
        if time.monotonic() > self._deadline:
            raise TimeoutError
        return self._response.read1(min(size, READ_BLOCK))


class _FewRedirects(urllib.request.HTTPRedirectHandler):
    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201 (urllib's signature)
        if not is_url(newurl):  # never from the web to a file:// or ftp:// path
            raise urllib.error.URLError(f"redirected to {newurl}, not an http(s) URL")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_FewRedirects)


def _why(exc: BaseException, url: str) -> str:
    """One line for a network failure, without the URL."""
    if isinstance(exc, urllib.error.HTTPError):
        if exc.code in (301, 302, 303, 307, 308):
            return f"more than {MAX_REDIRECTS} redirects"
        return f"the server answered HTTP {exc.code} {exc.reason}".rstrip()
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"no complete answer within {FETCH_TIMEOUT:g} s"
    if isinstance(reason, socket.gaierror):
        return f"cannot find the host {urlsplit(url).hostname} (DNS: {reason.strerror or reason})"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (is the server running?)"
    if isinstance(reason, ssl.SSLCertVerificationError):
        return f"the TLS certificate is not trusted ({reason.verify_message})"
    if isinstance(reason, ssl.SSLError):
        return f"TLS failed ({first_line(reason)[:160]})"
    if isinstance(reason, (ConnectionError, http.client.HTTPException)):
        return f"the connection failed ({type(reason).__name__}: {first_line(reason)[:160]})".replace(": )", ")")
    if isinstance(reason, OSError):
        return f"the network failed ({reason.strerror or first_line(reason)[:160]})"
    return f"cannot fetch it ({first_line(reason)[:160]})"
