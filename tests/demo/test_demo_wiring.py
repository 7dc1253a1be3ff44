"""`rlhfkit demo --quick` runs every stage and writes the report files (numbers are meaningless there);
`rlhfkit eval` measures what it says; the reward-hacking monitor fires on the drift it describes."""

from __future__ import annotations

import json

import pytest

from rlhfkit.cli.main import main
from rlhfkit.data.text_stats import distinct_n, repetition_rate, text_stats
from rlhfkit.trainers.online.monitor import HackingMonitor

KEYS = ("gold/sft", "gold/ppo", "gold/dpo", "gold/ppo_no_kl", "kl/ppo", "kl/ppo_no_kl", "rm/eval_accuracy", "seconds")


def test_quick_demo_writes_report(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--output-dir", str(out), "--quick", "--progress", "false"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in KEYS:
        assert isinstance(summary[key], float), key
    assert 0.5 < summary["rm/label_noise_ceiling"] < 1.0
    for name in ("sft", "ppo", "ppo_no_kl", "dpo"):  # shares in [0, 1]; NaN when no reply named a product
        for key in (f"names_product/{name}", f"mentions_product/{name}"):
            value = summary[key]
            assert isinstance(value, float) and (value != value or 0.0 <= value <= 1.0), key
    assert set(summary["stage_load_average"]) == set(summary["stage_seconds"])
    report = (out / "report.md").read_text()
    assert "| PPO (beta = 0) |" in report and "label-noise ceiling" in report and "names the product" in report
    assert report.splitlines()[2].startswith("**What this is.**")
    for png in ("ppo_curves.png", "proxy_vs_gold.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    for stage in ("sft", "rm", "ppo", "ppo_no_kl", "dpo"):
        assert (out / stage / "config.yaml").is_file()
    # PPO on a task with a judge logs the gold score
    rows = [json.loads(x) for x in (out / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert any("reward/gold" in r for r in rows)

    # `rlhfkit eval` on the demo's policy, against the SFT reference: KL of a model to itself is 0
    result = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "--model",
                str(out / "sft"),
                "--data",
                str(out / "data" / "prompts_eval.jsonl"),
                "--output",
                str(result),
                "--reference-model",
                str(out / "sft"),
                "--reward-model",
                str(out / "rm"),
                "--gold-judge",
                "support",
                "--num-prompts",
                "8",
                "--max-new-tokens",
                "8",
            ]
        )
        == 0
    )
    metrics = json.loads(result.read_text())
    assert metrics["n"] == 8 and abs(metrics["kl/ref"]) < 1e-4
    for key in ("reward/score", "reward/gold", "response/length", "response/distinct_2", "response/repetition"):
        assert key in metrics
    assert len(result.with_suffix(".samples.jsonl").read_text().splitlines()) == 8

    # `rlhfkit view` on the demo folder: each stage is a run with its curves, the report is the demo's
    from tests.viewer.test_viewer import served_json

    with served_json([str(out)]) as get:
        runs = {r["name"]: r["rows"] for r in get("/api/metrics")["runs"]}
        assert set(runs) == {f"demo/{s}" for s in ("sft", "rm", "ppo", "ppo_no_kl", "dpo")}
        assert all("reward/score" in row for row in runs["demo/ppo"] if "kl/ref" in row)
        assert any(r["rows"] for r in get("/api/samples")["runs"] if r["name"] == "demo/ppo")
        assert "label-noise ceiling" in get("/") and '<img src="/file/0/ppo_curves.png"' in get("/")


def test_text_stats_by_hand():
    assert distinct_n(["a b a b"], 1) == 0.5  # 2 unique of 4
    assert distinct_n(["a b a b"], 2) == pytest.approx(2 / 3, abs=1e-12)  # (a b), (b a), (a b)
    assert repetition_rate("sorry sorry sorry sorry") == pytest.approx(2 / 3, abs=1e-12)  # bigrams: 3, unique 1
    assert text_stats(["one two three"])["length"] == 3


class Log:
    enabled = True

    def __init__(self):
        self.lines = []

    def write(self, message):
        self.lines.append(message)


def test_monitor_warns_on_length_repetition_and_gold_drop():
    log = Log()
    mon = HackingMonitor(log, window=2)
    mon.observe(1, ["we are sorry we will refund it"] * 4, proxy=0.0, gold=1.0)
    assert log.lines == []
    mon.observe(2, ["we are sorry we are sorry we are sorry we are sorry we are sorry"] * 4, proxy=0.5, gold=0.8)
    assert any("length" in x for x in log.lines) and any("repetition" in x for x in log.lines)
    out = mon.observe(3, ["we are sorry we are sorry we are sorry we are sorry we are sorry"] * 4, proxy=1.0, gold=0.2)
    assert any("gold score fell" in x for x in log.lines)
    assert out["monitor/warnings"] == 3.0


def test_quick_arithmetic_demo_runs_sft_then_grpo_and_reports_accuracy(tmp_path):
    out = tmp_path / "arith"
    args = ["demo", "--task", "arithmetic", "--output-dir", str(out), "--quick", "--progress", "false"]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["accuracy/sft"] <= 1.0 and 0.0 <= summary["accuracy/grpo"] <= 1.0
    report = (out / "report.md").read_text()
    assert report.startswith("# rlhfkit demo: arithmetic") and "| GRPO |" in report
    assert (out / "grpo_curves.png").read_bytes()[:4] == b"\x89PNG"
    rows = [json.loads(x) for x in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert "reward/arithmetic_exact_answer" in rows[-1] and "reward/gold" in rows[-1]


def test_headline_names_the_over_optimisation_only_when_it_shows():
    from rlhfkit.demo.report import gold_peak, headline

    def run(gold, score, kl):
        return {"reward/gold": gold, "reward/score": score, "kl/ref": kl}

    m = {
        "sft": run(3.2, 0.5, 0.0),
        "ppo": run(4.8, 2.5, 2.0),
        "ppo_no_kl": run(4.0, 3.0, 60.0),
        "dpo": run(4.5, 2.4, 11),
    }
    rows = [{"step": s, "reward/gold": g} for s, g in ((1, 3.2), (10, 4.4), (30, 4.7), (60, 4.2), (100, 4.0))]
    assert gold_peak(rows) == (30, 4.7) and gold_peak([{"step": 1}]) is None
    text = " ".join(headline(m, 0.80, 0.82, gold_peak(rows)))
    assert "ends at 4.00, below PPO's with the penalty" in text and "peaked at 4.70 (step 30)" in text
    assert "KL 60 against 2.0" in text
    m["ppo_no_kl"] = run(2.0, 3.0, 60.0)
    assert "below where it started" in " ".join(headline(m, 0.80, 0.82, None))
    m["ppo_no_kl"] = run(4.9, 3.0, 12.0)  # gold above PPO's: no over-optimisation to name
    text = " ".join(headline(m, 0.80, 0.82, gold_peak(rows)))
    assert "does not show here" in text and "peaked" not in text


def test_a_stage_beside_the_others_reports_its_failure_with_its_log(tmp_path):
    from rlhfkit.demo.pipeline import Stages
    from rlhfkit.errors import UserError

    stages = Stages(total=1)
    job = stages.start("broken stage", "ppo", f"--model {tmp_path}/missing --data x.jsonl", tmp_path / "b.log", 1)
    with pytest.raises(UserError, match="broken stage failed") as err:
        stages.wait(job)
    assert "--output-dir is required" in str(err.value) and (tmp_path / "b.log").exists()
    assert "broken stage" not in stages.seconds


def test_a_stage_beside_the_others_is_timed_to_its_own_exit(tmp_path):
    import time

    from rlhfkit.demo.pipeline import Stages

    stages = Stages(total=2)
    start = time.perf_counter()
    job = stages.start("help", "ppo", "--help", tmp_path / "h.log", 1)
    stages.run("meanwhile", lambda: (job.watcher.join(), time.sleep(1.5)))
    stages.wait(job)
    assert stages.beside == {"help": "meanwhile"} and "--output-dir" in (tmp_path / "h.log").read_text()
    assert stages.seconds["help"] <= time.perf_counter() - start - 1.5  # not the time until wait was called
