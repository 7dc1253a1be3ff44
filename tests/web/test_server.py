"""The pages' web layer on its own: the checks every request passes, the answers to what no route takes, the
headers of every response, and a server that starts and stops in a thread, its port free again after."""

from __future__ import annotations

import http.client
import json
import logging
import secrets
import socket

import pytest

from rlhfkit.errors import UserError
from rlhfkit.web.server import CSP, MAX_BODY, REDACTED, HttpError, Server, json_body, json_response, route, web_app


def echo(request):
    return json_response({"got": json_body(request)})


def boom(request):
    raise RuntimeError("a bug")


def refuse(request):
    raise HttpError(409, "not now")


def boom_for_token(request):
    raise RuntimeError(f"no annotator for {request.path_params['token']}")


def expected_csrf(path: str) -> str | None:
    if path.startswith("/api/"):
        raise RuntimeError(f"cannot look up {path}")  # a bug in a middleware, the path in its message
    return "s3cret" if path == "/echo" else None


@pytest.fixture
def server():
    routes = [
        route("/echo", echo, "POST"),
        route("/boom", boom),
        route("/refuse", refuse),
        route("/a/{token}/boom", boom_for_token),
        route("/api/{token}/echo", echo, "POST"),
    ]
    app = web_app(routes, csrf=expected_csrf)
    running = Server(app, "127.0.0.1", 0).start()
    yield running
    running.stop()


def call(server, method, path, body=None, headers=None, raw_body=None, connection=None):
    """(status, headers, parsed JSON or text) for one request with exactly ``headers``."""
    conn = connection or http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    data = raw_body if raw_body is not None else (None if body is None else json.dumps(body).encode())
    for key, value in (headers or {}).items():
        conn.putheader(key, value)
    if data is not None and "Content-Length" not in (headers or {}):
        conn.putheader("Content-Length", str(len(data)))
    conn.endheaders(data)
    resp = conn.getresponse()
    text = resp.read().decode()
    if connection is None:
        conn.close()
    kind = resp.headers.get("Content-Type", "")
    return resp.status, resp.headers, json.loads(text) if kind.startswith("application/json") else text


def good(server, **extra):
    host = f"127.0.0.1:{server.port}"
    return {"Host": host, "Content-Type": "application/json", "X-CSRF-Token": "s3cret", **extra}


def test_a_same_origin_post_with_its_token_passes_and_every_answer_carries_the_security_headers(server):
    origin = f"http://127.0.0.1:{server.port}"
    status, headers, answer = call(
        server, "POST", "/echo", {"x": 1}, good(server, Origin=origin, **{"Sec-Fetch-Site": "same-origin"})
    )
    assert status == 200 and answer == {"got": {"x": 1}}
    for path, want in (("/echo", 405), ("/nope", 404), ("/refuse", 409)):
        status, headers, answer = call(server, "GET", path, headers={"Host": f"localhost:{server.port}"})
        assert status == want and answer["error"]
        assert headers["Content-Security-Policy"] == CSP and headers["Referrer-Policy"] == "no-referrer"
        assert headers["X-Frame-Options"] == "DENY" and headers["Cache-Control"] == "no-store"
    status, headers, _ = call(server, "GET", "/static/label.js", headers={"Host": f"[::1]:{server.port}"})
    assert status == 200 and headers["Cache-Control"] == "no-cache" and headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize(
    "change, status",
    [
        ({"Host": "evil.example"}, 421),  # DNS rebinding: another name for this address
        ({"Host": "127.0.0.1:1"}, 421),  # another port
        ({"Origin": "http://evil.example"}, 403),
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"X-CSRF-Token": "wrong"}, 403),
        ({"X-CSRF-Token": "s3cr\u00e9t"}, 403),  # not ASCII
        ({"Content-Type": "text/plain"}, 415),
    ],
)
def test_posts_that_fail_a_check_are_refused_before_the_route(server, change, status):
    code, headers, answer = call(server, "POST", "/echo", {"x": 1}, {**good(server), **change})
    assert code == status and "got" not in answer and answer["error"]
    assert headers["Content-Security-Policy"] == CSP


def test_bodies_need_a_length_of_at_most_max_body_and_must_be_json_objects(server):
    assert call(server, "POST", "/echo", headers=good(server))[0] == 411  # no Content-Length
    big = b'{"x": "' + b"y" * MAX_BODY + b'"}'
    assert call(server, "POST", "/echo", headers=good(server), raw_body=big)[0] == 413
    assert call(server, "POST", "/echo", headers=good(server), raw_body=b"[1, 2]")[0] == 400
    assert call(server, "POST", "/echo", headers=good(server), raw_body=b"{not json")[0] == 400


def test_a_bug_is_a_500_with_a_json_answer_and_a_logged_traceback(server, caplog):
    with caplog.at_level(logging.ERROR, logger="rlhfkit.web.server"):
        status, _, answer = call(server, "GET", "/boom", headers={"Host": f"127.0.0.1:{server.port}"})
    assert status == 500 and "internal error" in answer["error"]
    assert any("GET /boom failed" in r.getMessage() and "RuntimeError: a bug" in r.getMessage() for r in caplog.records)
    assert call(server, "GET", "/refuse", headers={"Host": f"127.0.0.1:{server.port}"})[0] == 409  # it goes on


def test_a_failed_request_leaves_its_token_out_of_the_log_and_of_the_answer(server, caplog):
    """A bug in a route, a bug in a middleware (on a path of a route and on one of none) and an unknown page,
    each on a path holding a token (the bugs with the token in their message): the token is in no log record of
    any logger, in no answer."""
    token = secrets.token_urlsafe(18)
    host = {"Host": f"127.0.0.1:{server.port}"}
    with caplog.at_level(logging.DEBUG):
        answers = [
            call(server, "GET", f"/a/{token}/boom", headers=host),
            call(server, "POST", f"/api/{token}/echo", {"x": 1}, good(server)),
            call(server, "POST", f"/api/{token}/nope", {"x": 1}, good(server)),  # no such route: the same bug
            call(server, "GET", f"/a/{token}/nope", headers=host),
        ]
    assert [status for status, _, _ in answers] == [500, 500, 500, 404]
    for _, headers, answer in answers:
        assert token not in json.dumps(answer) and token not in str(headers)
    logged = caplog.text + "".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert token not in logged
    assert f"GET /a/{REDACTED}/boom failed" in logged and f"RuntimeError: no annotator for {REDACTED}" in logged
    assert f"POST /api/{REDACTED}/echo failed" in logged and f"cannot look up /api/{REDACTED}/echo" in logged
    assert f"POST /api/{REDACTED}/nope failed" in logged


def test_static_files_are_only_the_shipped_ones(server):
    host = {"Host": f"127.0.0.1:{server.port}"}
    for path in ("/static/..%2Fserver.py", "/static/.hidden.js", "/static/nope.js", "/static/server.py"):
        assert call(server, "GET", path, headers=host)[0] == 404, path


def test_stop_closes_kept_alive_connections_and_frees_the_port():
    app = web_app([route("/refuse", refuse)])
    running = Server(app, "127.0.0.1", 0).start()
    port = running.port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    assert call(running, "GET", "/refuse", headers={"Host": f"127.0.0.1:{port}"}, connection=conn)[0] == 409
    running.stop()
    with pytest.raises((OSError, http.client.HTTPException)):  # the kept-alive connection was closed
        call(running, "GET", "/refuse", headers={"Host": f"127.0.0.1:{port}"}, connection=conn)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    again = Server(web_app([route("/refuse", refuse)]), "127.0.0.1", port).start()  # the same port at once
    try:
        assert call(again, "GET", "/refuse", headers={"Host": f"localhost:{port}"})[0] == 409
        with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}"):
            Server(web_app([]), "127.0.0.1", port)
    finally:
        again.stop()


def test_beyond_loopback_any_host_name_is_accepted():
    running = Server(web_app([route("/refuse", refuse)]), "0.0.0.0", 0).start()
    try:
        assert running.url("/x") == f"http://127.0.0.1:{running.port}/x"
        assert call(running, "GET", "/refuse", headers={"Host": f"labels.example:{running.port}"})[0] == 409
    finally:
        running.stop()
