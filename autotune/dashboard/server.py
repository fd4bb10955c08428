"""The web dashboard: reads the SQL store only, binds to 127.0.0.1 unless told otherwise.

Pages are rendered on the server (`_pages.py`, escaped HTML); plots are plotly.js figures built in
`_figures.py`, drawn by `static/dashboard.js` with the plotly.js that ships inside the installed
`plotly` package, so the dashboard loads nothing from the network. A running study's page refreshes
itself.

  /                         studies (select several to compare)
  /compare?study=A&study=B  studies side by side: answers, best-so-far curves
  /study/<name>             leaderboard (sortable) and the study's plots
  /study/<name>/trial/<n>   one trial: metrics, predicted vs measured step time, config, overrides, artifacts
  /artifact/<name>/<n>/<k>  an artifact file recorded by that trial, only from inside the study's run folder,
                            and only when that lies inside an --artifact-root (default /tmp/autotune-runs)
  /static/<file>            plotly.min.js and dashboard.js, nothing else
  /api/study/<name>         the leaderboard as JSON
  /metrics                  Prometheus metrics of every study
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qs, unquote, urlparse

from autotune.dashboard._artifacts import DOWNLOAD_TYPE, MAX_ARTIFACT_BYTES
from autotune.dashboard._pages import DashboardApp, page
from autotune.errors import ConfigError, StorageError, StudyError
from autotune.storage import Repository

__all__ = ["DashboardApp", "make_server", "serve_in_background", "serve_metrics"]

# frame-ancestors 'none': no other site may frame the pages (read-only, but a framed page can still be
# dressed up to mislead: clickjacking)
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "font-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
# an answer is sent this much at a time: the idle timeout bounds each send, so a slow but live reader
# (about 1 kB/s and up) is never cut off (review: 1 MiB sends cut readers below ~17 kB/s)
STREAM_CHUNK_BYTES = 64 * 1024
# a launcher's file: no script, no fetch, its own opaque origin even if a browser rendered it as a page
ARTIFACT_CSP = "default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; sandbox; frame-ancestors 'none'"
READ_METHODS = "GET, HEAD"
IDLE_TIMEOUT_S = 60.0
# a request's line and headers must all arrive within this many seconds of its thread taking the connection up:
# the idle timeout bounds each read only, so a client sending one header line a minute held its thread
# (and, with the cap below, its slot) for ever (review). The dashboard reads nothing after the headers.
REQUEST_HEAD_DEADLINE_S = 10.0
# connections served at once (one thread each): a client opening thousands held a thread and its stack
# each. Over the limit a connection is answered 503 at once, without a thread. No cap per client address:
# on loopback, and behind the proxy an exposed dashboard sits behind, every client has the same one.
# A flood of connections can still keep others out (any server with bounded resources can be flooded):
# an exposed dashboard belongs behind a proxy that limits rates.
MAX_CONNECTIONS = 256
_BUSY = b"too many connections, retry later\n"
BUSY_ANSWER = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nContent-Type: text/plain; charset=utf-8\r\n"
               b"X-Content-Type-Options: nosniff\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY))


def static_file(name: str) -> tuple[bytes, str] | None:
    """One of the two scripts the pages load; any other name is not found (no path is ever joined)."""
    if name == "dashboard.js":
        return (Path(__file__).with_name("static") / "dashboard.js").read_bytes(), "text/javascript; charset=utf-8"
    if name == "plotly.min.js":
        from importlib.resources import files

        return (files("plotly") / "package_data" / "plotly.min.js").read_bytes(), "text/javascript; charset=utf-8"
    return None


def is_loopback(host: str) -> bool:
    """True when `host` names only this machine (127.0.0.0/8, ::1 and ::ffff:127.x, localhost and the
    names under it, which browsers resolve to loopback themselves; a trailing dot is the same name)."""
    host = host.strip("[]").lower().removesuffix(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.partition("%")[0])  # an IPv6 zone (fe80::1%lo) is no address part
    except ValueError:
        return False  # a host name: it may resolve to any interface
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _host_name(header: str) -> str:
    """The host of a Host header, without its port: `[::1]:8080` -> `::1`, `localhost:80` -> `localhost`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class _HeadReader:
    """A connection's input while its request head is read: each read waits only for what is left of
    REQUEST_HEAD_DEADLINE_S (http.server reads the request line and each header with readline)."""

    def __init__(self, raw: BinaryIO, connection: socket.socket, idle_s: float) -> None:
        self.raw, self.connection, self.idle_s = raw, connection, idle_s
        self.deadline = time.monotonic() + REQUEST_HEAD_DEADLINE_S

    def readline(self, limit: int = -1) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no whole request within {REQUEST_HEAD_DEADLINE_S:g} s")
        self.connection.settimeout(min(left, self.idle_s))
        return self.raw.readline(limit)

    def __getattr__(self, name: str):
        return getattr(self.raw, name)


class _Handler(BaseHTTPRequestHandler):
    app: DashboardApp
    # bound to a loopback address: only requests naming a loopback host are answered. A web page on
    # another site can make the browser send requests here under its own name (DNS rebinding) and read
    # every study; its Host header then carries that name.
    loopback_only: bool = True
    metrics_only = False  # make_server(metrics_only=True): every path but /metrics is not found
    _head = False  # answering HEAD: the headers of GET, no body
    # seconds a connection may stay silent (reading a request, or a client not reading an answer): without
    # it, clients that open connections and send nothing (slowloris) each held a thread for ever
    timeout = IDLE_TIMEOUT_S

    def log_message(self, *args) -> None:  # quiet: the CLI prints the address once
        pass

    def setup(self) -> None:
        super().setup()
        self.rfile = _HeadReader(self.rfile, self.connection, self.timeout)  # type: ignore[assignment]

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.connection.settimeout(self.timeout)  # the answer: each send may wait the idle timeout again
        return parsed

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionError, TimeoutError):  # the client went away or went silent mid-answer: nobody to tell
            pass

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        self._head = True
        self.do_GET()

    def _not_allowed(self) -> None:
        """Any method but GET and HEAD: the dashboard only reads (405 with the same headers as every page,
        rather than http.server's bare 501)."""
        self.close_connection = True  # a body the client may have sent is never read
        self._allow = True
        self._fail(_is_api(_path_parts(self.path)), 405, "method not allowed", "the dashboard only reads: GET and HEAD")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed  # noqa: N815

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors; its 501 for a method HTTP does not define (`BREW`) names the methods
        that are allowed too (review: it came without Allow)."""
        if code == 501:
            self._allow = True
        super().send_error(code, message, explain)

    def end_headers(self) -> None:
        """Every answer gets the security headers, http.server's own errors (400, 414, 501) included."""
        if not self._secured:
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Security-Policy", CSP)
        if self._allow:
            self.send_header("Allow", READ_METHODS)
        self.send_header("X-Frame-Options", "DENY")
        self._secured = self._allow = False  # the next answer on this connection sets its own
        super().end_headers()

    _secured = False  # _send added its own Content-Security-Policy and nosniff
    _streaming = False  # an artifact's body is being sent (its headers are out)
    _allow = False  # a 405: name the methods that are allowed

    def _send(self, status: int, body: bytes | BinaryIO, content_type: str = "text/html; charset=utf-8",
              artifact: str | None = None) -> None:
        """`artifact`: the file name of a launcher-written artifact (served sandboxed, see _artifacts;
        a download keeps its name and extension, reduced to safe characters). `body` is bytes, or an
        artifact's open file, streamed in chunks (a trace of hundreds of MiB never sits in memory whole)."""
        length = len(body) if isinstance(body, bytes) else min(os.fstat(body.fileno()).st_size, MAX_ARTIFACT_BYTES)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", ARTIFACT_CSP if artifact is not None else CSP)
        self._secured = True
        if artifact is not None and content_type == DOWNLOAD_TYPE:
            # the name is the launcher's: only safe characters reach the header
            safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in artifact)[:100]
            self.send_header("Content-Disposition", f'attachment; filename="{safe or "artifact"}"')
        if content_type.startswith("text/javascript"):
            self.send_header("Cache-Control", "max-age=3600")
        self.end_headers()
        if self._head:
            return
        if isinstance(body, bytes):
            for start in range(0, len(body), STREAM_CHUNK_BYTES):
                self.wfile.write(body[start:start + STREAM_CHUNK_BYTES])
            return
        left = length
        self._streaming = True  # the status line is out: a failure from here on can only end the connection
        while left > 0:
            chunk = body.read(min(left, STREAM_CHUNK_BYTES))
            if not chunk:  # shrank since the length was sent: the client sees a short body, the connection ends
                self.close_connection = True
                return
            self.wfile.write(chunk)
            left -= len(chunk)

    def _fail(self, api: bool, status: int, title: str, heading: str, detail: str = "") -> None:
        """An error answer: `{"error": "heading: detail"}` to a client of /api, an HTML page (the heading and
        the detail, escaped here) to a browser."""
        if api:
            import json

            self._send(status, json.dumps({"error": heading + (f": {detail}" if detail else "")}).encode(),
                       "application/json")
        else:
            body = f"<h1>{escape(heading)}</h1>" + (f"<p>{escape(detail)}</p>" if detail else "")
            self._send(status, page(title, body))

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.loopback_only and not is_loopback(_host_name(self.headers.get("Host", "localhost"))):
            self._fail(_is_api(_path_parts(self.path)), 421, "misdirected", "this dashboard answers to localhost only")
            return
        parts = _path_parts(self.path)
        query = parse_qs(urlparse(self.path).query)
        api = _is_api(parts)
        try:
            if self.metrics_only and parts != ["metrics"]:  # `start --metrics-port`: Prometheus' endpoint alone
                self._fail(api, 404, "not found", "this port serves /metrics only")
            elif not parts:
                self._send(200, self.app.studies_page(query.get("study", [])))
            elif parts[0] == "compare" and len(parts) == 1:
                self._send(200, self.app.compare_page(query.get("study", [])[:20]))
            elif parts[0] == "static" and len(parts) == 2 and (found := static_file(parts[1])) is not None:
                self._send(200, *found)
            elif parts[0] == "metrics" and len(parts) == 1:
                from autotune.metrics import render_latest

                self._send(200, render_latest(self.app.repo), "text/plain; version=0.0.4")
            elif parts[0] == "api" and len(parts) == 3 and parts[1] == "study":
                self._send(200, self.app.api(parts[2]), "application/json")
            elif parts[0] == "study" and len(parts) == 2:
                self._send(200, self.app.study_page(parts[1], query.get("sort", ["tokens_per_s_per_gpu"])[0],
                                                    query.get("order", ["desc"])[0]))
            elif parts[0] == "study" and len(parts) == 4 and parts[2] == "trial" and _trial_number(parts[3]):
                self._send(200, self.app.trial_page(parts[1], int(parts[3])))
            elif parts[0] == "artifact" and len(parts) == 4 and _trial_number(parts[2]):
                found = self.app.artifact(parts[1], int(parts[2]), parts[3])
                if found is None:
                    self._fail(api, 404, "not found", "artifact not found")
                else:
                    with found[0] as handle:
                        self._send(200, handle, found[1], artifact=found[2])
            else:
                self._fail(api, 404, "not found", "not found")
        except StudyError as exc:
            self._fail(api, 404, "not found", str(exc))
        except StorageError as exc:  # unreachable, or a row edited by hand: say so, escaped, and live on
            self._fail(api, 503, "store error", "the store cannot be read", str(exc))
        except ConfigError as exc:  # a stored study names what this autotune does not know (a GPU, a setting)
            self._fail(api, 503, "store error", "the store holds a study this autotune cannot use", str(exc))
        except (ConnectionError, TimeoutError):
            raise  # the client is gone or silent: no error page to send (handle() ends the request quietly)
        except Exception as exc:  # a page that cannot render still gets an answer; the server lives on
            import sys

            sys.stderr.write(f"autotune dashboard: {self.path[:200]!r}: {exc.__class__.__name__}: {str(exc)[:200]}\n")
            if self._streaming:  # a second answer would land inside the first one's body: cut it short instead
                self.close_connection = True
                return
            self._fail(api, 500, "error", "this request could not be answered" if api else "this page could not be rendered")
        finally:
            self._streaming = False


def _path_parts(path: str) -> list[str]:
    """A request path's components, each unquoted (`/study/a%2Fb/` -> ["study", "a/b"])."""
    return [unquote(p) for p in urlparse(path).path.strip("/").split("/") if p]


def _is_api(parts: list[str]) -> bool:
    """A request for the JSON API: its errors are JSON too (review: an API client got HTML pages)."""
    return bool(parts) and parts[0] == "api"


MAX_TRIAL_NUMBER = 2**31 - 1  # the INTEGER column of trial numbers: a larger one is no trial, not an OverflowError


def _trial_number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 10 and int(text) <= MAX_TRIAL_NUMBER


class _Server(ThreadingHTTPServer):
    """http.server's threading server with a cap on the connections it serves at once (MAX_CONNECTIONS)."""

    daemon_threads = True

    def __init__(self, *args, **kwargs) -> None:
        self._slots = threading.Lock()
        self.open_connections = 0  # being served, each by its thread
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        with self._slots:
            busy = self.open_connections >= MAX_CONNECTIONS
            if not busy:
                self.open_connections += 1
        if busy:
            try:  # never wait on this client: the answer fits in the socket's buffer, or it is dropped
                request.setblocking(False)
                request.send(BUSY_ANSWER)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started (out of threads): the slot is not held
            self._release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def _release(self) -> None:
        with self._slots:
            self.open_connections -= 1


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


def make_server(repo: Repository, host: str = "127.0.0.1", port: int = 8080,
                artifact_roots=None, metrics_only: bool = False) -> ThreadingHTTPServer:
    """`artifact_roots`: the folders whose studies' run folders the dashboard serves files from (default
    /tmp/autotune-runs; _artifacts' module doc). `metrics_only`: serve /metrics and nothing else (`start
    --metrics-port`), with the dashboard's limits: connections at once, idle and request-head deadlines, the
    loopback Host check."""
    app = DashboardApp(repo, artifact_roots=artifact_roots)
    handler = type("Handler", (_Handler,), {"app": app, "loopback_only": is_loopback(host),
                                            "metrics_only": metrics_only})
    # an IPv6 address (::1, ::) needs an IPv6 socket; http.server's default family is IPv4
    server_class = _IPv6Server if ":" in host else _Server
    return server_class((host, port), handler)


def serve_in_background(repo: Repository, host: str = "127.0.0.1", port: int = 0,
                        artifact_roots=None, metrics_only: bool = False) -> ThreadingHTTPServer:
    server = make_server(repo, host, port, artifact_roots, metrics_only)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve_metrics(repo: Repository, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """`start --metrics-port`: /metrics alone on http://host:port (a daemon thread), with the dashboard's limits.
    prometheus_client's own server (start_http_server) took any number of connections at once, each a thread
    reading the store, and held a silent one for ever (the open items of the last notes). ConfigError when the
    port cannot be bound (found by an adversarial pass: a port taken between the start's check and Ray being up
    was a traceback, exit 1)."""
    try:
        return serve_in_background(repo, host, port, metrics_only=True)
    except OSError as exc:
        raise ConfigError(f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror or exc})") from None
