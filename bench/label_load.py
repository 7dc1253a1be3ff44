"""Load test of the labelling page: simulated annotators labelling at once over HTTP, then the export checked.

    .venv/bin/python bench/label_load.py [--annotators 20] [--seconds 60] [--pairs 40000] [--labels-per-item 1]
                                         [--judgments 0] [--reload-every 0] [--out FILE.json]

`rlhfkit label` runs as people run it, in its own process (`python -m rlhfkit label`, loopback, a free port), on
a new store in a temporary folder filled from --pairs candidate rows, with --labels-per-item. With --judgments N
the store first gets N answers, as if the same annotators had labelled for a year (each in turn the next pair of
their own order that still lacks labels), written in one transaction before the server starts. --annotators
threads (named a00, a01, ...) each play one person's page: load the page (its CSRF token) and fetch the state,
then until --seconds have passed post a judgment of the pair shown (A or B at random, sometimes with a strength)
with the headers the page's script sends, taking the next pair from the answer, over one kept-alive connection,
without pauses; with --reload-every K they load the page again (the page and its state) after every K labels. A
response other than 200 or a failed connection is an error. Then the server is stopped with Ctrl-C (SIGINT), the
labels are exported with `rlhfkit label --export`, and every acknowledged judgment (annotator, prompt, chosen,
rejected) must be in prefs.jsonl exactly once, beside the --judgments answers stored before: "missing" counts
acknowledged or stored judgments the export lacks, "extra" exported rows no annotator was told were saved.

Printed: annotators, pairs, judgments stored before, labels acknowledged, labels/s, the latency (p50, p99, ms;
from sending to the answer read) of the judgment requests and of the page loads after the first (page and
state), errors, missing; under the table the slowest first page load. The run, with its stamp (bench/stamp.py)
and the options that set what it measured (its command), is merged into --out (default
bench/reported/label_load.json) under its machine and commit (bench/results_file.py). tests/labelling runs
`run_load` for a few seconds.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DEFAULTS = {"annotators": 20, "seconds": 60.0, "pairs": 40000, "labels_per_item": 1, "judgments": 0, "reload_every": 0}
STRENGTHS = (None, None, "slightly", "clearly", "much")
YEAR = 365 * 24 * 3600.0
Row = tuple[str, str, str, str]  # (annotator, prompt, chosen, rejected), as prefs.jsonl has it


def candidate_rows(n: int) -> list[dict]:
    """n candidate rows of two responses each; every prompt differs, so a prompt names its pair."""
    return [
        {
            "prompt": f"Customer {i}: my order is late.\nAgent:",
            "responses": [f" sorry, order {i} ships today", f" wait {i}"],
        }
        for i in range(n)
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def label_config(argv: list[str]):
    from rlhfkit.config.pages import LabelConfig
    from rlhfkit.config.parse import parse_config

    cfg, _ = parse_config("rlhfkit label", LabelConfig, argv)
    return cfg


def prefill(
    data: Path, out: Path, names: list[str], judgments: int, labels_per_item: int = 1, seed: int = 0
) -> Counter:
    """The store ``rlhfkit label --data DATA --output-dir OUT --labels-per-item K`` makes, holding ``judgments``
    answers of ``names`` spread over the past year: each annotator in turn answers the next pair of their own
    order with fewer than K answers (as the server would have given them). Returns the rows the export makes of
    them."""
    from rlhfkit.labelling.app import open_store

    argv = ["--data", str(data), "--output-dir", str(out), "--labels-per-item", str(labels_per_item)]
    store = open_store(label_config(argv))
    try:
        items = store.items()
        store.add_annotators(names)
        orders = {name: iter(store.order(name)) for name in names}
        rng, taken, rows, expected = random.Random(seed), Counter(), [], Counter()
        now = time.time()
        for j in range(judgments):
            name = names[j % len(names)]
            item = next((i for i in orders[name] if taken[i] < labels_per_item), None)
            if item is None:
                raise ValueError(f"--judgments {judgments}: {name} has no pair left after {j} answers")
            taken[item] += 1
            left, choice = store.left_for(name, item), rng.choice("ab")
            answered = now - (judgments - j) * YEAR / judgments
            rows.append((f"prefill-{j:08d}", name, item, left, choice, rng.choice(STRENGTHS), answered - 20, answered))
            pair = items[item]
            chosen_x = (choice == "a") == (left == "x")
            chosen, rejected = (pair.x, pair.y) if chosen_x else (pair.y, pair.x)
            expected[(name, pair.prompt, chosen, rejected)] += 1
        with store.transaction() as db:
            db.executemany(
                "INSERT INTO judgments (request_id, annotator, item_id, left, choice, strength, shown_at, answered_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
    finally:
        store.close()
    return expected


def start_server(
    data: Path, out: Path, port: int, names: list[str], log, labels_per_item: int = 1
) -> tuple[subprocess.Popen, dict[str, str]]:
    """`rlhfkit label` in its own process; returns it and {annotator: page URL} once it accepts connections (the
    tokens are read from the store, which exists before the port is opened)."""
    cmd = [sys.executable, "-m", "rlhfkit", "label", "--data", str(data), "--output-dir", str(out)]
    cmd += ["--port", str(port), "--annotators", ",".join(names), "--labels-per-item", str(labels_per_item)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"`rlhfkit label` exited with status {proc.returncode} before serving")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("`rlhfkit label` did not open its port within 120 s") from None
            time.sleep(0.05)
    db = sqlite3.connect(out / "labels.sqlite")
    try:
        tokens = dict(db.execute("SELECT name, token FROM annotators").fetchall())
    finally:
        db.close()
    return proc, {name: f"/a/{tokens[name]}" for name in names}


class Annotator(threading.Thread):
    """One person's page over one kept-alive connection, labelling without pause until ``deadline``."""

    def __init__(self, name: str, port: int, page: str, deadline: float, seed: int, reload_every: int = 0):
        super().__init__(name=f"annotator-{name}", daemon=True)
        self.annotator, self.port, self.page, self.deadline = name, port, page, deadline
        self.reload_every = reload_every
        self.token = page.rsplit("/", 1)[1]
        self.rng = random.Random(seed)
        self.conn: http.client.HTTPConnection | None = None
        self.csrf = ""
        self.acked: list[Row] = []
        self.latencies: list[float] = []  # seconds per judgment request
        self.first_load: float | None = None  # seconds of the first page load (page and state)
        self.page_latencies: list[float] = []  # seconds per page load after the first
        self.errors: list[str] = []
        self.ran_out = False

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        origin = f"http://127.0.0.1:{self.port}"
        headers = {"Sec-Fetch-Site": "same-origin"}
        data = None
        if body is not None:  # what the page's fetch() sends
            data = json.dumps(body).encode()
            headers.update({"Content-Type": "application/json", "X-CSRF-Token": self.csrf, "Origin": origin})
        try:
            self.conn.request(method, path, body=data, headers=headers)
            resp = self.conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = None
            raise

    def run(self) -> None:
        try:
            self.label()
        except Exception as exc:  # an error ends this annotator; the run reports it
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            if self.conn is not None:
                self.conn.close()

    def load_page(self) -> dict | None:
        """The page (its CSRF token) and its state, as a browser opening the link; None after an error."""
        status, html = self.request("GET", self.page)
        if status != 200:
            self.errors.append(f"GET page: {status}")
            return None
        self.csrf = re.search(rb'name="csrf-token" content="([0-9a-f]+)"', html).group(1).decode()
        status, body = self.request("GET", f"/api/{self.token}/state")
        if status != 200:
            self.errors.append(f"GET state: {status} {body[:200]!r}")
            return None
        return json.loads(body)

    def label(self) -> None:
        started = time.perf_counter()
        state = self.load_page()
        self.first_load = time.perf_counter() - started
        while state is not None and time.monotonic() < self.deadline:
            item = state["item"]
            if item is None:
                self.ran_out = True
                return
            choice = self.rng.choice(["a", "b"])
            judgment = {"request_id": secrets.token_hex(12), "item_id": item["id"], "choice": choice}
            strength = self.rng.choice(STRENGTHS)
            if strength:
                judgment["strength"] = strength
            started = time.perf_counter()
            status, body = self.request("POST", f"/api/{self.token}/judge", judgment)
            self.latencies.append(time.perf_counter() - started)
            if status != 200:
                self.errors.append(f"POST judge: {status} {body[:200]!r}")
                return
            answer = json.loads(body)
            chosen, rejected = (item["a"], item["b"]) if choice == "a" else (item["b"], item["a"])
            self.acked.append((self.annotator, item["prompt"], chosen, rejected))
            state = answer["state"]
            if self.reload_every and len(self.acked) % self.reload_every == 0:
                started = time.perf_counter()
                state = self.load_page()
                self.page_latencies.append(time.perf_counter() - started)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def exported_rows(out: Path) -> list[Row]:
    """`rlhfkit label --output-dir OUT --export`, in this process; prefs.jsonl's rows as acknowledged ones."""
    from rlhfkit.labelling.app import run

    paths = run(label_config(["--output-dir", str(out), "--export"]))
    rows = [json.loads(line) for line in paths["prefs.jsonl"].read_text(encoding="utf-8").splitlines() if line]
    return [(r["annotator"], r["prompt"], r["chosen"], r["rejected"]) for r in rows]


def run_load(
    annotators: int = 20,
    seconds: float = 60.0,
    pairs: int = 40000,
    work: Path | None = None,
    judgments: int = 0,
    reload_every: int = 0,
    labels_per_item: int = 1,
) -> dict:
    """The load test (see the module docstring) in ``work`` (a temporary folder when None); its figures."""
    if work is None:
        with tempfile.TemporaryDirectory(prefix="label_load_") as tmp:
            return run_load(annotators, seconds, pairs, Path(tmp), judgments, reload_every, labels_per_item)
    data = work / "candidates.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in candidate_rows(pairs)), encoding="utf-8")
    out, port = work / "labels", free_port()
    names = [f"a{i:02d}" for i in range(annotators)]
    stored = prefill(data, out, names, judgments, labels_per_item) if judgments else Counter()
    with open(work / "server.log", "wb") as log:
        proc, pages = start_server(data, out, port, names, log, labels_per_item)
        try:
            started = time.monotonic()
            threads = [
                Annotator(name, port, pages[name], started + seconds, seed=i, reload_every=reload_every)
                for i, name in enumerate(names)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=seconds + 120)
            elapsed = time.monotonic() - started
            stopping = time.monotonic()
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            exit_code = proc.wait(timeout=60)
            shutdown = time.monotonic() - stopping
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    acked = Counter(row for t in threads for row in t.acked)
    exported = Counter(exported_rows(out))
    latencies = [x for t in threads for x in t.latencies]
    page_latencies = [x for t in threads for x in t.page_latencies]
    first_loads = [t.first_load for t in threads if t.first_load is not None]
    errors = [f"{t.annotator}: {e}" for t in threads for e in t.errors]
    errors += [f"{t.annotator}: still running after the deadline" for t in threads if t.is_alive()]
    labels = sum(acked.values())
    return {
        "annotators": annotators,
        "pairs": pairs,
        "labels_per_item": labels_per_item,
        "judgments_before": judgments,
        "seconds": round(elapsed, 2),
        "labels": labels,
        "labels_per_s": round(labels / elapsed, 1),
        "p50_ms": ms(percentile(latencies, 50)),
        "p99_ms": ms(percentile(latencies, 99)),
        "page_loads": len(page_latencies),
        "page_p50_ms": ms(percentile(page_latencies, 50)),
        "page_p99_ms": ms(percentile(page_latencies, 99)),
        "first_page_max_ms": ms(max(first_loads, default=None)),
        "errors": len(errors),
        "error_messages": errors[:10],
        "missing": sum((acked + stored - exported).values()),
        "extra": sum((exported - acked - stored).values()),
        "ran_out_of_pairs": sum(t.ran_out for t in threads),
        "server_exit_code": exit_code,  # 130: stopped by Ctrl-C, as `rlhfkit label` reports it
        "shutdown_s": round(shutdown, 2),
        "cpu_count": os.cpu_count(),
    }


def table(r: dict) -> str:
    """The run's row; runs recorded before the page-load and --judgments figures show '-' there."""
    num = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    lines = [
        "| annotators | pairs | judgments before | seconds | labels | labels/s | label p50 ms | label p99 ms "
        "| page p50 ms | page p99 ms | errors | missing |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {r['annotators']} | {r['pairs']} | {r.get('judgments_before', 0)} | {r['seconds']:.1f} | {r['labels']} | "
        f"{r['labels_per_s']:.1f} | {num(r['p50_ms'])} | {num(r['p99_ms'])} | {num(r.get('page_p50_ms'))} | "
        f"{num(r.get('page_p99_ms'))} | {r['errors']} | {r['missing']} |",
    ]
    notes = []
    if r.get("labels_per_item", 1) != 1:
        notes.append(f"{r['labels_per_item']} labels per pair")
    if r.get("page_loads"):
        notes.append(f"{r['page_loads']} page loads after the first (page and state)")
    if r.get("first_page_max_ms") is not None:
        notes.append(f"slowest first page load {r['first_page_max_ms']:.1f} ms")
    if r["extra"]:
        notes.append(f"{r['extra']} exported row(s) never acknowledged")
    if r["ran_out_of_pairs"]:
        notes.append(f"{r['ran_out_of_pairs']} annotator(s) ran out of pairs (raise --pairs)")
    notes += r["error_messages"]
    notes.append(f"server stopped by Ctrl-C in {r['shutdown_s']:.2f} s, exit status {r['server_exit_code']}")
    return "\n".join(lines + notes)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(BENCH))
    import results_file
    from stamp import Stamp, summary

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--annotators", type=int, default=DEFAULTS["annotators"])
    parser.add_argument("--seconds", type=float, default=DEFAULTS["seconds"])
    parser.add_argument("--pairs", type=int, default=DEFAULTS["pairs"], help="candidate pairs in the store")
    parser.add_argument(
        "--labels-per-item", type=int, default=DEFAULTS["labels_per_item"], help="answers each pair is given to"
    )
    parser.add_argument(
        "--judgments", type=int, default=DEFAULTS["judgments"], help="answers stored before the server starts"
    )
    parser.add_argument(
        "--reload-every", type=int, default=DEFAULTS["reload_every"], help="labels between page loads (0: none)"
    )
    parser.add_argument("--out", default=str(BENCH / "reported" / "label_load.json"))
    args = results_file.parse_or_report(parser, argv, lambda run: print(table(run["results"])))
    if args is None:
        return 0
    stamp = Stamp()
    result = run_load(
        args.annotators,
        args.seconds,
        args.pairs,
        judgments=args.judgments,
        reload_every=args.reload_every,
        labels_per_item=args.labels_per_item,
    )
    record = stamp.record()
    print(table(result))
    print(summary(record))
    options = vars(args)
    command = " ".join(x for x in ("bench/label_load.py", results_file.option_text(options, DEFAULTS)) if x)
    run = {"stamp": record, "command": command, "args": options, "results": result}
    key = results_file.run_key(record["commit"], options, DEFAULTS)
    results_file.merge(Path(args.out), "label_load", results_file.machine_key(record), key, run)
    return 0 if result["errors"] == 0 and result["missing"] == 0 and result["extra"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
