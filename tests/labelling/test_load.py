"""Load and faults: 20 annotators answering at once over HTTP for a few seconds on a store of 45,000 answers
(bench/label_load.py), and the server killed (SIGKILL) in the middle and started again on the same output folder;
every acknowledged answer must be stored exactly once, and exported, and the 99th-percentile wait stays short."""

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


STORED = 45_000  # answers in the store before the run: 5,000 pairs with 10 labels each, nine-tenths given
# 99th-percentile wait allowed: measured 70-90 ms on a busy 2-core machine (180 ms at its busiest); a store that
# scans every answer per request takes 2-3 s here (and fewer than 100 labels)
MAX_P99_MS = 1500


def test_twenty_annotators_for_a_few_seconds_on_a_well_labelled_store_lose_nothing_and_wait_little(tmp_path):
    """bench/label_load.py's run, short, on a store already holding 45,000 answers: every acknowledged label is in
    the export beside the stored ones, nothing failed, Ctrl-C stopped the server cleanly, and answers and page
    loads stay quick (a store that scanned every answer for each request takes seconds here)."""
    result = label_load.run_load(
        annotators=20, seconds=3.0, pairs=5000, work=tmp_path, judgments=STORED, reload_every=5, labels_per_item=10
    )
    assert result["errors"] == 0, result["error_messages"]
    assert result["missing"] == 0 and result["extra"] == 0
    assert result["labels"] >= 100 and result["ran_out_of_pairs"] == 0
    assert result["p50_ms"] is not None and result["p99_ms"] >= result["p50_ms"]
    assert result["p99_ms"] < MAX_P99_MS and result["page_p99_ms"] < MAX_P99_MS, result
    assert result["server_exit_code"] == 130  # stopped by SIGINT, as after Ctrl-C
    assert len((tmp_path / "labels" / "prefs.jsonl").read_text().splitlines()) == STORED + result["labels"]
