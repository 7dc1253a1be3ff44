"""A small HTTP server for rlhfkit's local pages (the labelling app and the run viewer).

The standard library's ``ThreadingHTTPServer`` and a table of routes: no web framework to install, and
every request goes through the same few checks in one place:

- the ``Host`` header must name this server (a page on another site cannot reach it through DNS rebinding);
- a state-changing request (POST) must be same-origin: its ``Origin`` (and ``Sec-Fetch-Site``, which
  browsers send) must be this server, and its body JSON of at most ``MAX_BODY`` bytes;
- every response carries a Content-Security-Policy that allows scripts and styles from this server's
  own files only (no inline script, nothing from elsewhere), and ``Referrer-Policy: no-referrer`` so the
  annotators' token URLs never leak.
"""

from __future__ import annotations

import html
import ipaddress
import json
import re
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from string import Template
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rlhfkit.errors import UserError

STATIC_DIR = Path(__file__).with_name("static")
MAX_BODY = 16 * 1024  # bytes of a request body; a judgment is a few hundred
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".png": "image/png"}


class HttpError(Exception):
    """Ends a request with ``status`` and a JSON body ``{"error": message}``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: Any  # email.message.Message: case-insensitive .get()
    body: bytes = b""
    params: dict[str, str] = field(default_factory=dict)  # the route pattern's named groups

    def json(self) -> dict:
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            raise HttpError(415, "send the body as application/json")
        try:
            obj = json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise HttpError(400, "the body is not valid JSON") from None
        if not isinstance(obj, dict):
            raise HttpError(400, "the body must be a JSON object")
        return obj


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(obj, ensure_ascii=False).encode("utf-8"), "application/json; charset=utf-8")


def page(name: str, raw: dict[str, str] | None = None, **values: str) -> Response:
    """The HTML file ``static/NAME`` with ``$key`` placeholders replaced by HTML-escaped ``values``, and by the
    HTML in ``raw`` (markup this package made itself, such as ``markdown.render``'s, never outside text)."""
    text = Template((STATIC_DIR / name).read_text(encoding="utf-8"))
    body = text.substitute({**{k: html.escape(str(v), quote=True) for k, v in values.items()}, **(raw or {})})
    return Response(200, body.encode("utf-8"), "text/html; charset=utf-8")


def static_file(name: str) -> Response:
    """One of the files shipped in ``static/`` (scripts, styles); nothing outside that folder."""
    path = STATIC_DIR / name
    if "/" in name or name.startswith(".") or path.suffix not in CONTENT_TYPES or not path.is_file():
        raise HttpError(404, "no such file")
    return Response(200, path.read_bytes(), CONTENT_TYPES[path.suffix], {"Cache-Control": "no-cache"})


Handler = Callable[[Request], Response]


@dataclass
class Route:
    method: str
    pattern: re.Pattern
    handler: Handler


class App:
    """Routes (method, path regex with named groups, handler) served by ``serve``."""

    def __init__(self) -> None:
        self.routes: list[Route] = []
        # Host headers accepted: the loopback names of the port served on; None (any) on other interfaces,
        # where the names people reach the machine by are unknown and the annotator tokens guard the pages.
        self.allowed_hosts: set[str] | None = set()
        self.route("GET", r"/static/(?P<name>[\w.-]+)", lambda req: static_file(req.params["name"]))

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        self.routes.append(Route(method, re.compile(pattern), handler))

    def dispatch(self, req: Request) -> Response:
        try:
            self._check_host(req)
            if req.method == "POST":
                self._check_same_origin(req)
            allowed = []
            for route in self.routes:
                match = route.pattern.fullmatch(req.path)
                if match:
                    if route.method == req.method:
                        req.params = match.groupdict()
                        return route.handler(req)
                    allowed.append(route.method)
            raise HttpError(405 if allowed else 404, "method not allowed" if allowed else "not found")
        except HttpError as exc:
            return json_response({"error": exc.message}, exc.status)
        except Exception:  # a bug: the page gets a 500 and the console the traceback, the server goes on
            traceback.print_exc()
            return json_response({"error": "internal error (see the server's console)"}, 500)

    def _check_host(self, req: Request) -> None:
        if self.allowed_hosts is not None and (req.headers.get("Host") or "").lower() not in self.allowed_hosts:
            raise HttpError(421, "unknown Host header: open the address the server printed")

    def _check_same_origin(self, req: Request) -> None:
        origin = req.headers.get("Origin")
        if origin is not None and origin.lower() != f"http://{(req.headers.get('Host') or '').lower()}":
            raise HttpError(403, "cross-origin request refused")
        site = req.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            raise HttpError(403, "cross-site request refused")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _loopback_host_names(port: int) -> set[str]:
    return {f"{name}:{port}" for name in ("localhost", "127.0.0.1", "[::1]")}


def _handler_class(app: App, quiet: bool) -> type[BaseHTTPRequestHandler]:
    class RequestHandler(BaseHTTPRequestHandler):
        server_version = "rlhfkit"
        sys_version = ""
        protocol_version = "HTTP/1.1"
        timeout = 60  # seconds a connection may sit idle or half-sent before its thread lets it go

        def setup(self) -> None:
            super().setup()
            with self.server.connections_lock:
                self.server.connections.add(self.connection)

        def finish(self) -> None:
            with self.server.connections_lock:
                self.server.connections.discard(self.connection)
            super().finish()

        def do_GET(self) -> None:  # noqa: N802 (the standard library's spelling)
            self._handle("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._handle("POST")

        def _handle(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = self.headers.get("Content-Length")
            if method == "POST" and length is None:
                return self._send(json_response({"error": "Content-Length required"}, 411))
            try:
                size = int(length or 0)
            except ValueError:
                size = -1
            if size < 0 or size > MAX_BODY:
                self.close_connection = True
                return self._send(json_response({"error": f"request body over {MAX_BODY} bytes"}, 413))
            body = self.rfile.read(size) if size else b""
            self._send(app.dispatch(Request(method, url.path, query, self.headers, body)))

        def _send(self, resp: Response) -> None:
            self.send_response(resp.status)
            self.send_header("Content-Type", resp.content_type)
            self.send_header("Content-Length", str(len(resp.body)))
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("X-Frame-Options", "DENY")
            self.send_header("Cross-Origin-Resource-Policy", "same-origin")
            headers = {"Cache-Control": "no-store", **resp.headers}
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(resp.body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the standard library's name)
            if not quiet:
                sys.stderr.write(f"{self.address_string()} {format % args}\n")

    return RequestHandler


class Server:
    """``app`` served on ``host:port`` by threads (one per connection); ``port=0`` picks a free port."""

    def __init__(self, app: App, host: str, port: int, quiet: bool = True):
        try:
            self.httpd = ThreadingHTTPServer((host, port), _handler_class(app, quiet))
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
        self.httpd.daemon_threads = True
        self.httpd.connections = set()  # open client connections, so that stop() ends kept-alive ones too
        self.httpd.connections_lock = threading.Lock()
        self.host = host
        self.port = self.httpd.server_address[1]
        app.allowed_hosts = _loopback_host_names(self.port) if is_loopback(host) else None
        self._thread: threading.Thread | None = None

    def url(self, path: str = "/") -> str:
        host = "127.0.0.1" if host_is_any(self.host) else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}{path}"

    def serve_forever(self) -> None:
        try:
            self.httpd.serve_forever()
        finally:
            self.httpd.server_close()

    def start(self) -> Server:
        """Serve in a background thread (tests, notebooks); ``stop`` ends it."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        with self.httpd.connections_lock:
            connections = list(self.httpd.connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join()


def host_is_any(host: str) -> bool:
    return host in ("0.0.0.0", "::", "")
