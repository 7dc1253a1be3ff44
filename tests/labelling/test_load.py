"""Load and faults: 20 annotators answering at once over HTTP for a few seconds (bench/label_load.py), and the
server killed (SIGKILL) in the middle and started again on the same output folder; every acknowledged answer
must be stored exactly once, and exported."""

from __future__ import annotations

import http.client
import os
import secrets
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter

from tests.helpers import write_jsonl

from .label_helpers import Client, bench_script, candidate_rows

label_load = bench_script("label_load")  # `rlhfkit label` in its own process, simulated annotators

ANNOTATORS = 20
PER_ANNOTATOR = 50
KILL_AFTER = 400  # acknowledged answers before the kill


def start_server(data, out, port: int) -> tuple[subprocess.Popen, dict[str, str]]:
    """`rlhfkit label` in its own process on ``port``; it and {annotator: page URL} once it serves."""
    names = [f"a{i:02d}" for i in range(ANNOTATORS)]
    proc, pages = label_load.start_server(data, out, port, names, subprocess.DEVNULL)
    return proc, {name: f"http://127.0.0.1:{port}{page}" for name, page in pages.items()}


def annotate(url: str, acked: list[str], counter: Counter, lock: threading.Lock, deadline: float) -> None:
    """Answer PER_ANNOTATOR pairs; a request that got no answer is sent again with the same request id."""
    client = Client(url)

    def retry(call):
        while True:
            try:
                return call()
            except (OSError, http.client.HTTPException, ValueError):  # refused, reset or cut off: the server is down
                assert time.monotonic() < deadline, "server unreachable for too long"
                time.sleep(0.05)

    retry(client.load_page)
    rng = secrets.SystemRandom()
    while len(acked) < PER_ANNOTATOR:
        item = retry(client.state)["item"]
        assert item is not None, "ran out of pairs"
        body = {"request_id": secrets.token_hex(12), "item_id": item["id"], "choice": rng.choice(["a", "b", "tie"])}
        status, answer = retry(lambda: client.request("POST", "judge", body))
        assert status == 200, answer
        acked.append(body["request_id"])
        with lock:
            counter["acked"] += 1


def test_concurrent_annotators_survive_a_kill_and_restart(tmp_path):
    data = write_jsonl(tmp_path / "candidates.jsonl", candidate_rows(ANNOTATORS * PER_ANNOTATOR + 100))
    out = tmp_path / "out"
    port = label_load.free_port()
    proc, urls = start_server(data, out, port)
    acked = {name: [] for name in urls}
    counter, lock = Counter(), threading.Lock()
    started = time.monotonic()
    deadline = started + 120
    threads = [
        threading.Thread(target=annotate, args=(urls[n], acked[n], counter, lock, deadline), daemon=True) for n in urls
    ]
    for t in threads:
        t.start()
    while counter["acked"] < KILL_AFTER:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    acked_at_kill = counter["acked"]
    proc, urls_again = start_server(data, out, port)
    try:
        assert urls_again == urls  # the same private links after a restart
        for t in threads:
            t.join(timeout=max(1.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "annotators did not finish"
    finally:
        proc.terminate()
        proc.wait()
    seconds = time.monotonic() - started

    db = sqlite3.connect(out / "labels.sqlite")
    stored = db.execute("SELECT request_id, annotator, item_id FROM judgments WHERE undone_at IS NULL").fetchall()
    all_acked = [rid for ids in acked.values() for rid in ids]
    assert len(all_acked) == ANNOTATORS * PER_ANNOTATOR and 0 < acked_at_kill < len(all_acked)
    assert Counter(rid for rid, _, _ in stored) == Counter(all_acked)  # each acknowledged answer exactly once
    assert len(stored) == len(all_acked)
    per_item = Counter(item for _, _, item in stored)
    assert max(per_item.values()) == 1  # one label per pair: no two annotators were given the same pair
    assert Counter(name for _, name, _ in stored) == {name: PER_ANNOTATOR for name in urls}
    print(f"{len(all_acked)} acknowledged, {len(stored)} stored, killed after {acked_at_kill}, {seconds:.1f} s")


def test_twenty_annotators_for_a_few_seconds_lose_nothing(tmp_path):
    """bench/label_load.py's run, short: every acknowledged label is in the export, nothing failed, and Ctrl-C
    stopped the server cleanly."""
    result = label_load.run_load(annotators=20, seconds=3.0, pairs=3000, work=tmp_path)
    assert result["errors"] == 0, result["error_messages"]
    assert result["missing"] == 0 and result["extra"] == 0
    assert result["labels"] >= 100 and result["ran_out_of_pairs"] == 0
    assert result["p50_ms"] is not None and result["p99_ms"] >= result["p50_ms"]
    assert result["server_exit_code"] == 130  # stopped by SIGINT, as after Ctrl-C
    assert len((tmp_path / "labels" / "prefs.jsonl").read_text().splitlines()) == result["labels"]
