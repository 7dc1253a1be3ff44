"""The local pages' web app and server: Starlette routes served by uvicorn, behind the same checks everywhere.

``web_app`` builds a Starlette app whose middleware checks every request before a route sees it:

- ``Guard``: the ``Host`` header must name this server (a page on another site cannot reach it through DNS
  rebinding; Starlette's ``TrustedHostMiddleware`` checks the name, ``Guard`` the port); a state-changing
  request (POST) must be same-origin (its ``Origin`` and ``Sec-Fetch-Site``, which browsers send, must be this
  server) with a ``Content-Length`` of at most ``MAX_BODY`` bytes; every response carries a
  Content-Security-Policy that allows scripts and styles from this server's own files only (no inline script,
  nothing from elsewhere), and ``Referrer-Policy: no-referrer`` so that the annotators' token URLs never leak;
  and a bug anywhere behind it becomes a 500 with a JSON answer and a traceback in the log;
- ``CsrfGuard`` (where the app passes ``csrf``): a POST must carry the ``X-CSRF-Token`` its page was given.

A route's ``{token}`` parameter is a secret (an annotator's private link): the log and the error answers never
show it (``redact``). Routes are plain functions of a Starlette ``Request`` run in a worker thread (the label
store is blocking SQLite), after the body is read; they end a request early by raising ``HttpError``.
``Server`` serves an app on a socket bound at once (so ``port=0`` has its number before serving), in the
calling thread until Ctrl-C (``serve_forever``) or in a background thread until ``stop`` (``start``).
"""

from __future__ import annotations

import hmac
import html
import ipaddress
import json
import logging
import re
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from string import Template
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rlhfkit.errors import UserError

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("static")
MAX_BODY = 16 * 1024  # bytes of a request body; a judgment is a few hundred
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
}
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".png": "image/png"}
SECRET_PARAMS = ("token",)  # route parameters that are secrets: never logged
REDACTED = "<token>"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")  # a path parameter in a route's template: {name} or {name:type}
Handler = Callable[[Request], Response]


class HttpError(Exception):
    """Ends a request with ``status`` and a JSON body ``{"error": message}``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def json_response(obj: Any, status: int = 200) -> Response:
    body = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    return Response(body, status, media_type="application/json; charset=utf-8")


def json_body(request: Request) -> dict:
    """A POST's body (read by ``route`` before the handler runs) as a JSON object."""
    if (request.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
        raise HttpError(415, "send the body as application/json")
    try:
        obj = json.loads(request.state.body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise HttpError(400, "the body is not valid JSON") from None
    if not isinstance(obj, dict):
        raise HttpError(400, "the body must be a JSON object")
    return obj


def page(name: str, raw: dict[str, str] | None = None, **values: str) -> Response:
    """The HTML file ``static/NAME`` with ``$key`` placeholders replaced by HTML-escaped ``values``, and by the
    HTML in ``raw`` (markup this package made itself, such as ``markdown.render``'s, never outside text)."""
    text = Template((STATIC_DIR / name).read_text(encoding="utf-8"))
    body = text.substitute({**{k: html.escape(str(v), quote=True) for k, v in values.items()}, **(raw or {})})
    return Response(body.encode("utf-8"), 200, media_type="text/html; charset=utf-8")


def static_file(name: str) -> Response:
    """One of the files shipped in ``static/`` (scripts, styles); nothing outside that folder."""
    path = STATIC_DIR / name
    if "/" in name or name.startswith(".") or path.suffix not in CONTENT_TYPES or not path.is_file():
        raise HttpError(404, "no such file")
    return Response(
        path.read_bytes(), 200, media_type=CONTENT_TYPES[path.suffix], headers={"Cache-Control": "no-cache"}
    )


def route(path: str, handler: Handler, method: str = "GET") -> Route:
    """A Starlette route calling ``handler(request)`` in a worker thread, the body already read; an
    ``HttpError`` becomes its JSON answer, any other exception a 500 (``Guard``'s)."""

    async def endpoint(request: Request) -> Response:
        request.state.body = await request.body() if method == "POST" else b""
        try:
            return await run_in_threadpool(handler, request)
        except HttpError as exc:
            return json_response({"error": exc.message}, exc.status)

    return Route(path, endpoint, methods=[method])


def secrets_of(scope: Scope) -> list[str]:
    """The parts of the request's path that stand where a route of the app has a secret parameter
    (``SECRET_PARAMS``) after the same leading parts, whether or not the rest of the path matches (a mistyped
    page of a real link hides its token too)."""
    parts = scope["path"].split("/")
    found = []
    for candidate in scope["app"].router.routes:
        template = getattr(candidate, "path", "").split("/")
        for i, part in enumerate(template[: len(parts)]):
            param = _PARAM.fullmatch(part)
            if param and param.group(1) in SECRET_PARAMS and template[:i] == parts[:i] and parts[i]:
                found.append(parts[i])
    return found


def redact(text: str, secrets: list[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``REDACTED`` (the longest first)."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def web_app(routes: list[Route], csrf: Callable[[str], str | None] | None = None) -> Starlette:
    """The app serving ``routes`` and ``/static/NAME`` behind ``Guard`` (and ``CsrfGuard`` with ``csrf``, which
    maps a POST's path to the token it must carry). ``Server`` sets the Host names it accepts."""

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        message = {404: "not found", 405: "method not allowed"}.get(status, "request refused")
        headers = getattr(exc, "headers", None) or {}
        return JSONResponse({"error": message}, status, headers=headers)

    middleware = [Middleware(Guard)]
    if csrf is not None:
        middleware.append(Middleware(CsrfGuard, expected=csrf))
    statics = route("/static/{name}", lambda req: static_file(req.path_params["name"]))
    app = Starlette(routes=[*routes, statics], middleware=middleware, exception_handlers={HTTPException: http_error})
    # Host headers accepted: none until served; then the loopback names with the port served on, or None (any)
    # on other interfaces, where the names people reach the machine by are unknown and the annotator tokens
    # guard the pages.
    app.state.allowed_hosts, app.state.port = [], None
    return app


async def _refuse(status: int, message: str, scope: Scope, receive: Receive, send: Send) -> None:
    await json_response({"error": message}, status)(scope, receive, send)


class Guard:
    """Host allow-list, same-origin and sized POSTs, the security headers on every response, and a 500 for a
    bug behind it (see the module docstring)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_secured(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                for key, value in SECURITY_HEADERS.items():
                    headers[key] = value
                if "cache-control" not in headers:
                    headers["Cache-Control"] = "no-store"
            await send(message)

        refused = await self.check(scope, receive)
        if refused is not None:
            return await _refuse(*refused, scope, receive, send_secured)
        try:
            await self.app(scope, receive, send_secured)
        except Exception as exc:  # a bug: the page gets a 500 and the log the traceback, the server goes on
            secrets = secrets_of(scope)
            trace = "".join(traceback.format_exception(exc)).rstrip()
            logger.error("%s %s failed\n%s", scope["method"], redact(scope["path"], secrets), redact(trace, secrets))
            if not started:
                await json_response({"error": "internal error (see the server's console)"}, 500)(
                    scope, receive, send_secured
                )

    @staticmethod
    async def host_allowed(scope: Scope, receive: Receive) -> bool:
        """Whether the ``Host`` header names this server: its name by Starlette's ``TrustedHostMiddleware``
        (which answers a refusal itself; Guard answers its own instead), its port by Guard."""
        state = scope["app"].state
        if state.allowed_hosts is None:
            return True
        passed = False

        async def allowed(scope: Scope, receive: Receive, send: Send) -> None:
            nonlocal passed
            passed = True

        async def discard(message: Message) -> None:
            pass

        await TrustedHostMiddleware(allowed, state.allowed_hosts, www_redirect=False)(scope, receive, discard)
        port = (Headers(scope=scope).get("host") or "").rpartition(":")[2]
        return passed and port == str(state.port)

    @classmethod
    async def check(cls, scope: Scope, receive: Receive) -> tuple[int, str] | None:
        if not await cls.host_allowed(scope, receive):
            return 421, "unknown Host header: open the address the server printed"
        headers = Headers(scope=scope)
        host = (headers.get("host") or "").lower()
        if scope["method"] != "POST":
            return None
        origin = headers.get("origin")
        if origin is not None and origin.lower() != f"http://{host}":
            return 403, "cross-origin request refused"
        site = headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return 403, "cross-site request refused"
        length = headers.get("content-length")
        if length is None:
            return 411, "Content-Length required"
        if not length.isdigit() or int(length) > MAX_BODY:
            return 413, f"request body over {MAX_BODY} bytes"
        return None


class CsrfGuard:
    """A POST must carry, in ``X-CSRF-Token``, the token ``expected(path)`` names; where that is None (the path
    names no page, such as an unknown annotator's link) the route answers."""

    def __init__(self, app: ASGIApp, expected: Callable[[str], str | None]):
        self.app = app
        self.expected = expected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            want = await run_in_threadpool(self.expected, scope["path"])
            given = Headers(scope=scope).get("x-csrf-token") or ""
            if want is not None and not hmac.compare_digest(given.encode("latin-1"), want.encode()):
                return await _refuse(403, "missing or wrong CSRF token: reload the page", scope, receive, send)
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_is_any(host: str) -> bool:
    return host in ("0.0.0.0", "::", "")


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, remembering the first signal that stopped it."""

    stopped_by: int | None = None

    def handle_exit(self, sig: int, frame) -> None:
        if self.stopped_by is None:
            self.stopped_by = sig
        super().handle_exit(sig, frame)


class Server:
    """``app`` served by uvicorn on ``host:port``; ``port=0`` picks a free port. The socket is bound and
    listening from construction, so a client that connects before serving starts waits instead of failing."""

    def __init__(self, app: Starlette, host: str, port: int):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self.socket = socket.create_server((host, port), family=family, backlog=2048)
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
        self.host = host
        self.port = self.socket.getsockname()[1]
        app.state.allowed_hosts = list(LOOPBACK_NAMES) if is_loopback(host) else None
        app.state.port = self.port
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,  # rlhfkit's own logging; uvicorn's loggers say only what goes wrong
            log_level="warning",
            access_log=False,
            proxy_headers=False,  # nothing stands in front of this server: X-Forwarded-* would be forged
            server_header=False,
            timeout_graceful_shutdown=5,  # seconds a request may still run once stopping
        )
        self.uvicorn = _Uvicorn(config)
        self._thread: threading.Thread | None = None

    def url(self, path: str = "/") -> str:
        host = "127.0.0.1" if host_is_any(self.host) else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}{path}"

    def serve_forever(self) -> None:
        """Serve in this thread until Ctrl-C (or SIGTERM): open requests are finished, then the signal goes on
        (Ctrl-C as ``KeyboardInterrupt``); a second Ctrl-C stops at once."""
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self.socket.close()
        # uvicorn passes the signal on once it has shut down, but whether a Ctrl-C then surfaces here depends on
        # when asyncio's own SIGINT handling saw it: the caller always gets KeyboardInterrupt (exit status 130)
        if self.uvicorn.stopped_by == signal.SIGINT:
            raise KeyboardInterrupt

    def start(self, timeout: float = 30.0) -> Server:
        """Serve in a background thread (the iterate loop, tests, notebooks) until ``stop``."""

        def serve() -> None:
            try:
                self.uvicorn.run(sockets=[self.socket])  # no signal handlers: those belong to the main thread
            except BaseException:  # a thread's exception would otherwise vanish silently
                logger.exception("the web server stopped")

        self._thread = threading.Thread(target=serve, name=f"rlhfkit-web-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.uvicorn.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.uvicorn.started:
            self.stop()
            raise RuntimeError(f"the web server on port {self.port} did not start")
        return self

    def stop(self) -> None:
        """End serving: kept-alive connections are closed, and the port is free when this returns."""
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.socket.close()
