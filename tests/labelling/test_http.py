"""The labelling server over HTTP: who may change what, and what is refused."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import urllib.error
import urllib.request

import pytest

from rlhfkit.errors import UserError
from rlhfkit.labelling.app import run, start
from rlhfkit.web.server import REDACTED
from tests.helpers import run_cli, write_jsonl

from .label_helpers import Client, candidate_rows, label_config, serve


@pytest.fixture
def running(tmp_path):
    running = serve(tmp_path, candidate_rows(5), "--annotators", "alice,bob")
    yield running
    running.stop()


@pytest.fixture
def alice(running) -> Client:
    client = Client(running.url("alice"))
    client.load_page()
    return client


def test_the_page_has_no_inline_script_and_a_strict_content_security_policy(running):
    with urllib.request.urlopen(running.url("alice")) as resp:
        csp = resp.headers["Content-Security-Policy"]
        html = resp.read().decode()
        assert resp.headers["Referrer-Policy"] == "no-referrer"
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", html, re.S)
    assert scripts and all('src="/static/' in attrs and not body.strip() for attrs, body in scripts)
    assert not re.search(r"<[^>]+\son\w+=", html)  # no inline event handlers


def test_state_changes_need_the_csrf_token_and_the_same_origin(running, alice):
    item = alice.state()["item"]["id"]
    body = {"request_id": "req-000001", "item_id": item, "choice": "a"}
    assert alice.request("POST", "judge", body, {"X-CSRF-Token": ""})[0] == 403
    bob = Client(running.url("bob"))
    bob.load_page()
    assert alice.request("POST", "judge", body, {"X-CSRF-Token": bob.csrf})[0] == 403  # bob's token is not alice's
    assert alice.request("POST", "judge", body, {"Origin": "http://evil.example"})[0] == 403
    assert alice.request("POST", "judge", body, {"Sec-Fetch-Site": "cross-site"})[0] == 403
    assert alice.request("GET", "state", headers={"Host": "evil.example:80"})[0] == 421  # DNS rebinding
    assert running.store.judgments() == []
    origin = alice.base  # what a browser sends from the page itself
    status, answer = alice.request("POST", "judge", body, {"Origin": origin, "Sec-Fetch-Site": "same-origin"})
    assert status == 200 and answer["new"] is True
    assert alice.request("POST", "judge", body)[1]["new"] is False  # the same request again: stored once
    assert len(running.store.judgments()) == 1


@pytest.mark.parametrize(
    "change, status",
    [
        ({"choice": "c"}, 400),
        ({"choice": "<script>"}, 400),
        ({"strength": "enormously"}, 400),
        ({"choice": "tie", "strength": "much"}, 400),
        ({"comment": "x" * 2001}, 400),
        ({"admin": True}, 400),
        ({"request_id": "short"}, 400),
        ({"item_id": "1"}, 400),
        ({"item_id": 10_000}, 409),
    ],
)
def test_bad_answers_are_refused_and_nothing_is_stored(running, alice, change, status):
    body = {"request_id": "req-000001", "item_id": alice.state()["item"]["id"], "choice": "a", **change}
    code, answer = alice.request("POST", "judge", body)
    assert code == status and answer["error"]
    assert running.store.judgments() == []


def test_size_limits_content_type_and_unknown_links(running, alice):
    big = {"request_id": "req-000001", "item_id": 1, "choice": "a", "comment": "x" * 20_000}
    assert alice.request("POST", "judge", big)[0] == 413
    assert alice.request("POST", "judge", {"x": 1}, {"Content-Type": "text/plain"})[0] == 415
    stranger = Client(running.server.url("/a/not-a-token"))
    assert stranger.request("GET", "state")[0] == 404
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(running.server.url("/a/not-a-token"))
    assert err.value.code == 404
    comment = "fine\n" * 10
    code, _ = alice.judge("b", comment=comment, strength="slightly")
    assert code == 200 and running.store.judgments()[0].comment == comment.strip()


def test_a_failing_request_on_an_annotators_link_shows_the_token_in_no_log_and_no_answer(
    running, alice, caplog, monkeypatch
):
    def broken(annotator):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(running.store, "state", broken)
    token = running.tokens["alice"]
    with caplog.at_level(logging.DEBUG):
        failed = alice.request("GET", "state")
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{running.url('alice')}/nope")
    assert failed[0] == 500 and missing.value.code == 404
    assert token not in json.dumps(failed[1]) and token not in missing.value.read().decode()
    assert token not in caplog.text + "".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert f"GET /api/{REDACTED}/state failed" in caplog.text and "OperationalError: disk I/O error" in caplog.text


def test_binding_beyond_this_machine_needs_named_annotators(tmp_path):
    data = write_jsonl(tmp_path / "c.jsonl", candidate_rows(2))
    cfg = label_config(["--data", str(data), "--output-dir", str(tmp_path / "out"), "--host", "0.0.0.0", "--port", "0"])
    with pytest.raises(UserError, match="name the annotators"):
        start(cfg)


@pytest.mark.parametrize(
    "row, message",
    [
        ({"prompt": "p", "responses": ["only one"]}, "line 2: field 'responses': needs two or more responses"),
        ({"prompt": "p", "responses": ["a", "  "]}, "line 2: field 'responses[1]': empty string"),
        ({"prompt": "p", "responses": "a b"}, "line 2: field 'responses': expected a list of responses, got str"),
        ({"responses": ["a", "b"]}, "line 2: field 'prompt': missing"),
        ({"prompt": "p", "chosen": "a"}, "line 2: field 'rejected': missing"),
        (
            {"prompt": "p", "completion": "c"},
            "line 2: this row has no responses to compare (fields: completion, prompt)",
        ),
        (
            {"prompt": "p", "responses": [[{"role": "robot", "content": "x"}], "b"]},
            "line 2: field 'responses[0][0].role': unknown role 'robot'",
        ),
    ],
)
def test_bad_candidate_rows_get_the_trainers_one_line_errors(tmp_path, capsys, row, message):
    data = write_jsonl(tmp_path / "c.jsonl", [candidate_rows(1)[0], row])
    code, out, err = run_cli(capsys, "label", "--data", data, "--output-dir", tmp_path / "out", "--port", "0")
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: {data}: {message}")
    assert not (tmp_path / "out" / "labels.sqlite").exists()  # nothing written before every row is checked


def test_the_guidelines_are_one_click_away_and_rendered_safely(tmp_path):
    guide = tmp_path / "guidelines.md"
    guide.write_text("# How to judge\n\n- prefer **helpful** replies\n- <script>window.x = 1</script>\n")
    running = serve(tmp_path, candidate_rows(2), "--guidelines", str(guide))
    try:
        page = urllib.request.urlopen(running.url("annotator")).read().decode()
        link = re.search(r'<a class="link-button" href="([^"]+)"[^>]*>Guidelines</a>', page)
        assert link and "hidden" not in link.group(0)
        html = urllib.request.urlopen(running.server.url(link.group(1))).read().decode()
        assert "<h1>How to judge</h1>" in html and "<strong>helpful</strong>" in html
        assert "&lt;script&gt;" in html and "<script>window" not in html
    finally:
        running.stop()
    (tmp_path / "bare").mkdir()
    bare = serve(tmp_path / "bare", candidate_rows(2))  # no --guidelines: no button
    try:
        page = urllib.request.urlopen(bare.url("annotator")).read().decode()
        assert re.search(r'<a class="link-button"[^>]* hidden>Guidelines</a>', page)
    finally:
        bare.stop()


def test_the_export_names_each_file_it_wrote_in_the_log(tmp_path, caplog):
    running = serve(tmp_path, candidate_rows(3), "--annotators", "alice")
    client = Client(running.url("alice"))
    client.load_page()
    assert client.judge("a")[0] == 200
    running.stop()
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger="rlhfkit.labelling.app"):
        paths = run(label_config(["--output-dir", str(out), "--export"]))
    assert sorted(paths) == ["agreement.json", "prefs.jsonl", "ties.jsonl"]
    assert [r.getMessage() for r in caplog.records] == [f"wrote {path}" for path in paths.values()]
    assert len((out / "prefs.jsonl").read_text().splitlines()) == 1
