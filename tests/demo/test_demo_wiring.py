"""`rlhfkit demo --quick` runs every stage and writes the report files (numbers are meaningless there, and its
report says so); `rlhfkit eval` measures what it says; the reward-hacking monitor fires on the drift it describes."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from rlhfkit.cli.main import main
from rlhfkit.data.text_stats import distinct_n, repetition_rate, text_stats
from rlhfkit.trainers.online.monitor import HackingMonitor

KEYS = ("gold/sft", "gold/ppo", "gold/dpo", "gold/ppo_no_kl", "gold/iterated", "gold/online_dpo")
KEYS += ("kl/ppo", "kl/ppo_no_kl", "kl/iterated", "kl/online_dpo")
KEYS += ("rm/eval_accuracy", "seconds")


def console_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def test_quick_demo_writes_report(tmp_path, capsys, monkeypatch):
    from rlhfkit.demo import support
    from rlhfkit.demo.report import QUICK_RUN

    # a core to spare: iterated PPO, then beta = 0, run in a child process beside the others; SFT and the
    # evaluation, which run alone, on both stages' threads
    monkeypatch.setattr(support.os, "cpu_count", lambda: 2)
    evaluated_on = []

    def evaluate_policy(*args, **kwargs):
        evaluated_on.append(torch.get_num_threads())
        return evaluate(*args, **kwargs)

    evaluate = support.evaluate_policy
    monkeypatch.setattr(support, "evaluate_policy", evaluate_policy)
    out = tmp_path / "demo"
    assert main(["demo", "--output-dir", str(out), "--quick", "--progress", "false"]) == 0
    assert yaml.safe_load((out / "sft" / "config.yaml").read_text())["threads"] == 2
    assert yaml.safe_load((out / "rm" / "config.yaml").read_text())["threads"] == 0  # the demo's own: 1
    assert evaluated_on == [2] * 7  # sft, ppo, ppo_no_kl, dpo, ppo_gold, iterated, online_dpo
    assert yaml.safe_load((out / "online_dpo" / "config.yaml").read_text())["threads"] == 1  # beside beta = 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["quick"] is True
    for key in KEYS:
        assert isinstance(summary[key], float), key
    assert 0.5 < summary["rm/label_noise_ceiling"] < 1.0
    for name in ("sft", "ppo", "ppo_no_kl", "dpo", "iterated", "online_dpo"):  # in [0, 1]; NaN: none named one
        for key in (f"names_product/{name}", f"mentions_product/{name}"):
            value = summary[key]
            assert isinstance(value, float) and (value != value or 0.0 <= value <= 1.0), key
    assert set(summary["stage_load_average"]) == set(summary["stage_seconds"])
    report = (out / "report.md").read_text()
    assert "| PPO (beta = 0) |" in report and "label-noise ceiling" in report and "names the product" in report
    # iterated PPO: half the offline labels, then the simulated raters on its own pairs, round by round
    assert "| iterated PPO |" in report and "## Iterated PPO, round by round" in report
    rounds = summary["iterated/rounds"]
    assert [r["round"] for r in rounds] == [1, 2] and all(0 < r["labels"] <= 8 for r in rounds)
    assert all(0.0 <= r["rm_accuracy_new_pairs"] <= 1.0 for r in rounds)
    offline = (out / "data" / "prefs_train.jsonl").read_text().splitlines()
    assert (out / "data" / "prefs_half.jsonl").read_text().splitlines() == offline[: len(offline) // 2]
    iterate_config = yaml.safe_load((out / "iterated" / "config.yaml").read_text())
    assert iterate_config["judge"] == "support" and iterate_config["model"] == str(out / "sft")
    # online DPO: the same labels (the same offline half, as many pairs a round, as many rounds), DPO for PPO
    online_config = yaml.safe_load((out / "online_dpo" / "config.yaml").read_text())
    assert online_config["algorithm"] == "dpo" and iterate_config["algorithm"] == "ppo"
    for key in ("prefs", "judge", "pairs_per_round", "rounds", "model"):
        assert online_config[key] == iterate_config[key], key
    assert "| online DPO |" in report and (out / "online_dpo" / "final" / "config.json").is_file()
    assert report.splitlines()[2] == QUICK_RUN and report.splitlines()[4].startswith("**What this is.**")
    assert "What it shows" not in report and "over-optimisation)" not in report  # no conclusions from noise
    assert "-0.00" not in report

    # the console: stage headers in the order the stages started, the same order as the report's stage times; the
    # child's whole log path; the report's path last
    console = console_lines(capsys.readouterr().err)
    started = [m.group(1) for m in map(re.compile(r"demo \d+/11: (.*?) ─").search, console) if m]
    assert started[3:10] == [
        "iterated PPO",
        "reward model",
        "PPO (KL penalty on)",
        "DPO",
        "PPO with the gold judge as reward",
        "PPO without KL (beta = 0)",
        "online DPO",
    ]
    assert started == list(summary["stage_seconds"])
    log = (out / "ppo_no_kl.log").resolve()
    assert f"in a child process beside the next stages; its log: {log}" in console
    assert console[-1] == f"report: {(out / 'report.md').resolve()}"
    # the child's log: the command it ran, then its progress bar to the last step
    command, *output = log.read_text().splitlines()
    assert command == f"rlhfkit ppo --config {log.with_suffix('.yaml')}"
    assert (out / "iterated.log").read_text().startswith(f"rlhfkit iterate --config {out.resolve()}/iterated.yaml")
    beside = summary["stage_beside"]  # which stages began while each child ran depends on the children's speed
    assert set(beside) == {"iterated PPO", "PPO without KL (beta = 0)"}
    assert beside["iterated PPO"].startswith("reward model") and beside["PPO without KL (beta = 0)"] == "online DPO"
    options = yaml.safe_load(log.with_suffix(".yaml").read_text())
    assert options["kl_coef"] == 0 and options["model"] == str(out / "sft") and options["progress"] is True
    assert "2/2" in output[-1]
    for png in ("ppo_curves.png", "proxy_vs_gold.png", "scores_against_kl.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    # the reward model against the judge: on the held-out pairs, and on each policy's own replies
    held_out = summary["diagnostics"]["held_out"]
    assert held_out["rm/pairs"] == 100 and 0.0 <= held_out["rm_judge/pairs_agreement"] <= 1.0
    policies = {"sft", "ppo", "ppo_no_kl", "dpo", "ppo_gold", "iterated", "online_dpo"}
    assert set(summary["diagnostics"]["policies"]) == policies
    # PPO with the gold judge as its reward: one change from PPO, the reward (no reward model)
    gold_config = yaml.safe_load((out / "ppo_gold" / "config.yaml").read_text())
    ppo_config = yaml.safe_load((out / "ppo" / "config.yaml").read_text())
    assert gold_config["reward_fn"] == ["support"] and not gold_config["reward_model"]
    different = {k for k in ppo_config if ppo_config[k] != gold_config.get(k)}
    assert different == {"reward_model", "reward_fn", "output_dir"}, different
    assert "| PPO (gold judge as reward) |" in report
    assert "## How far the reward model carries" in report and "scores_against_kl.png" in report
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
        assert set(runs) == {f"demo/{s}" for s in ("sft", "rm", "ppo", "ppo_no_kl", "dpo", "ppo_gold")}
        assert all("reward/score" in row for row in runs["demo/ppo"] if "kl/ref" in row)
        assert any(r["rows"] for r in get("/api/samples")["runs"] if r["name"] == "demo/ppo")
        page = get("/")
        assert "label-noise ceiling" in page and '<img src="/file/0/ppo_curves.png"' in page
        assert '<img src="/file/0/scores_against_kl.png"' in page and "How far the reward model carries" in page


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


def test_quick_arithmetic_demo_runs_sft_then_grpo_and_reports_accuracy(tmp_path, capsys):
    from rlhfkit.demo.report import QUICK_RUN

    out = tmp_path / "arith"
    args = ["demo", "--task", "arithmetic", "--output-dir", str(out), "--quick", "--progress", "false"]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["quick"] is True
    assert 0.0 <= summary["accuracy/sft"] <= 1.0 and 0.0 <= summary["accuracy/grpo"] <= 1.0
    report = (out / "report.md").read_text()
    assert report.startswith("# rlhfkit demo: arithmetic") and "| GRPO |" in report
    assert report.splitlines()[2] == QUICK_RUN and "went from" not in report and "-0.00" not in report
    assert console_lines(capsys.readouterr().err)[-1] == f"report: {(out / 'report.md').resolve()}"
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
    m["ppo"], m["ppo_no_kl"] = run(4.8, 2.5, -0.004), run(4.9, 3.0, -0.01)  # estimates of a KL near 0
    assert "(KL 0.0 against 0.0)" in " ".join(headline(m, 0.80, 0.82, None))


def test_numbers_that_round_to_zero_print_without_a_sign():
    from rlhfkit.demo.report import kl_note, number

    assert [number(x) for x in (-0.0004, -0.004999, 0.0, -0.0, 0.004)] == ["0.00"] * 5
    assert number(-0.005001) == "-0.01" and number(0.126) == "0.13" and number(float("nan")) == "nan"
    assert number(-0.3, ".0f") == "0" and number(-0.6, ".0f") == "-1" and number(-0.001, "+.2f") == "+0.00"
    assert kl_note([-0.004, 0.5, float("nan")]) == []  # shown as 0.00: nothing to explain
    assert kl_note([-0.3], ".0f") == []
    note = " ".join(kl_note([0.5, -0.02]))
    assert "never negative" in note and "estimate can be" in note


def fake_results(kl: dict[str, float]) -> dict:
    """What the demo's evaluation returns, for each policy named in ``kl`` (its KL to SFT)."""
    sample = {"prompt": "Customer: hi. Agent:", "response": " hello", "gold": 1.0}
    metrics = {
        "n": 4.0,
        "reward/gold": 3.0,
        "reward/score": 1.0,
        "response/length": 5.0,
        "response/tokens": 5.0,
        "response/distinct_2": 1.0,
        "response/repetition": 0.0,
    }
    return {n: {"metrics": {**metrics, "kl/ref": v}, "samples": [sample]} for n, v in kl.items()}


def test_full_and_quick_reports_of_the_support_task(tmp_path):
    from rlhfkit.demo.report import QUICK_RUN, write_report

    stages = SimpleNamespace(seconds={"SFT": 3.0}, load={"SFT": 1.0}, beside={})
    results = fake_results({"sft": 0.0, "ppo": -0.0004, "ppo_no_kl": 1.5, "dpo": -0.05})
    assert write_report(tmp_path, results, 0.8, stages, 60.0)["quick"] is False
    assert json.loads((tmp_path / "summary.json").read_text())["quick"] is False
    report = (tmp_path / "report.md").read_text()
    assert report.splitlines()[2].startswith("**What this is.**") and "**What it shows.**" in report
    assert QUICK_RUN not in report
    assert "| PPO (KL on) | 3.000 | 1.000 | 0.00 |" in report and "| DPO | 3.000 | 1.000 | -0.05 |" in report
    assert "The true KL is never negative" in report  # DPO's -0.05 is explained

    results["dpo"]["metrics"]["kl/ref"] = 0.05
    write_report(tmp_path, results, 0.8, stages, 60.0, quick=True)
    assert json.loads((tmp_path / "summary.json").read_text())["quick"] is True
    report = (tmp_path / "report.md").read_text()
    assert report.splitlines()[2] == QUICK_RUN and "What it shows" not in report
    assert "never negative" not in report


def test_report_gives_each_gold_score_its_standard_error(tmp_path):
    from rlhfkit.demo.report import gold_standard_error, write_report

    golds = {"sft": [1.0, 2.0, 3.0, 2.0], "ppo": [2.0, 2.0, 4.0, 4.0], "ppo_no_kl": [0.0] * 4, "dpo": [3.0] * 4}
    assert gold_standard_error([{"gold": g} for g in golds["sft"]]) == pytest.approx(0.4082, abs=1e-4)
    assert math.isnan(gold_standard_error([{"gold": 1.0}]))  # one reply: no spread to measure
    stages = SimpleNamespace(seconds={"SFT": 3.0}, load={"SFT": 1.0}, beside={})
    results = fake_results({"sft": 0.0, "ppo": 1.0, "ppo_no_kl": 9.0, "dpo": 2.0})
    for name, policy in results.items():
        policy["samples"] = [{"prompt": "Customer: hi. Agent:", "response": " hello", "gold": g} for g in golds[name]]
        policy["metrics"]["reward/gold"] = sum(golds[name]) / 4
    summary = write_report(tmp_path, results, 0.8, stages, 60.0)
    assert summary["gold_se/ppo"] == pytest.approx(0.5774, abs=1e-4) and summary["gold_se/dpo"] == 0.0
    report = (tmp_path / "report.md").read_text()
    assert "| SFT | 2.000 ± 0.408 |" in report and "| PPO (KL on) | 3.000 ± 0.577 |" in report
    # the differences from SFT, reply by reply: PPO's are 1, 0, 1, 2 and DPO's 2, 1, 0, 1
    assert summary["gold_diff_se"]["ppo-sft"] == pytest.approx(0.4082, abs=1e-4)
    assert "raised it by +1.00 (± 0.41), to 3.00" in report
    assert "one standard error of the difference" in report


def test_sample_headings_show_the_customer_message_of_a_chat_prompt(tmp_path):
    from rlhfkit.demo.report import write_report

    stages = SimpleNamespace(seconds={"SFT": 3.0}, load={"SFT": 1.0}, beside={})
    results = fake_results({"sft": 0.0, "ppo": 0.5, "ppo_no_kl": 1.5, "dpo": 0.4})
    for policy in results.values():
        chat = [{"role": "user", "content": "My  lamp\narrived broken."}]
        policy["samples"] = [{"prompt": chat, "response": "Sorry.\n\nA new lamp\nis on its way.", "gold": 2.0}]
    write_report(tmp_path, results, 0.8, stages, 60.0)
    report = (tmp_path / "report.md").read_text()
    assert "**My lamp arrived broken.**" in report and "'role'" not in report
    assert "- *DPO* (gold 2.00): Sorry. A new lamp is on its way." in report  # one line per reply


def test_full_and_quick_reports_of_the_arithmetic_task(tmp_path):
    from rlhfkit.demo.arithmetic import write_report
    from rlhfkit.demo.report import QUICK_RUN

    results = fake_results({"sft": 0.0, "grpo": -0.03})
    assert write_report(tmp_path, results, {"SFT": 3.0}, 60.0)["quick"] is False
    report = (tmp_path / "report.md").read_text()
    assert "went from **3.000** after SFT to **3.000** after GRPO" in report and QUICK_RUN not in report
    assert "| GRPO | 3.000 | -0.03 |" in report and "never negative" in report

    results["grpo"]["metrics"]["kl/ref"] = -0.0004
    write_report(tmp_path, results, {"SFT": 3.0}, 60.0, quick=True)
    assert json.loads((tmp_path / "summary.json").read_text())["quick"] is True
    report = (tmp_path / "report.md").read_text()
    assert report.splitlines()[2] == QUICK_RUN and "went from" not in report
    assert "| GRPO | 3.000 | 0.00 |" in report and "never negative" not in report


def test_a_stage_beside_the_others_reports_its_failure_with_its_log(tmp_path):
    from rlhfkit.demo.stages import Stages, stage_config
    from rlhfkit.errors import UserError

    stages = Stages(total=1)
    config = stage_config("init-model", {"corpus": str(tmp_path / "missing.txt"), "output_dir": str(tmp_path / "m")})
    job = stages.start("broken stage", "init-model", config, tmp_path / "b.log", 1)
    with pytest.raises(UserError, match="broken stage failed") as err:
        stages.wait(job)
    assert "missing.txt" in str(err.value) and (tmp_path / "b.log").exists()
    assert "broken stage" not in stages.seconds


def test_a_stage_beside_the_others_is_timed_to_its_own_exit(tmp_path, capsys):
    import time

    from rlhfkit.demo.stages import Stages, stage_config

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the customer asked for a refund and the agent said sorry\n" * 50)
    config = stage_config("init-model", {"corpus": str(corpus), "output_dir": str(tmp_path / "base")})
    stages = Stages(total=3)
    start = time.perf_counter()
    job = stages.start("help", "init-model", config, tmp_path / "h.log", 1)
    stages.run("meanwhile", lambda: (job.watcher.join(), time.sleep(1.5)))
    stages.run("after", lambda: None)
    stages.wait(job)
    log = (tmp_path / "h.log").read_text()
    assert log.startswith(f"rlhfkit init-model --config {tmp_path / 'h.yaml'}\n") and "wrote a tiny" in log
    assert (tmp_path / "base" / "config.json").is_file()
    assert stages.beside == {"help": "meanwhile"}  # it had ended before "after" began
    assert stages.seconds["help"] <= time.perf_counter() - start - 1.5  # not the time until wait was called
    assert list(stages.seconds) == list(stages.load) == ["help", "meanwhile", "after"]  # the order they started

    # the console: the whole log path, however long, and the child's end where it happened, not at ``wait``
    console = console_lines(capsys.readouterr().err)
    assert f"in a child process beside the next stages; its log: {(tmp_path / 'h.log').resolve()}" in console
    order = [line for line in console if line.startswith(("done", "waiting"))]
    assert [line.split(" in ")[0] for line in order] == ["done help", "done meanwhile", "done after"]

    # a child that continues what an earlier run began (iterate --resume): its time counts that run's seconds too
    stages = Stages(total=1)
    start = time.perf_counter()
    job = stages.start("continued", "init-model", config, tmp_path / "c.log", 1, done_before=100.0)
    stages.wait(job)
    assert 100.0 < stages.seconds["continued"] <= 100.0 + time.perf_counter() - start
    assert stages.earlier_seconds == 100.0


def test_stages_that_run_alone_take_the_threads_of_two():
    from rlhfkit.demo.support import schedule_threads

    # (a core to spare, a stage alone, online DPO): one thread a stage on two cores, the beta = 0 run on or off
    assert schedule_threads(1, True, 2) == (True, 2, 1)
    assert schedule_threads(1, False, 2) == (True, 2, 2)
    # no core to spare: every stage on the threads asked for
    assert schedule_threads(1, True, 1) == (False, 1, 1)
    assert schedule_threads(2, False, 2) == (False, 2, 2)
    assert schedule_threads(0, False, 8) == (False, 0, 0)  # torch's default: every core already


def test_quick_demo_on_a_given_model_skips_init_model_and_starts_from_it(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from rlhfkit.demo import plan, support
    from rlhfkit.models import loading

    monkeypatch.setattr(plan, "LORA_ABOVE", 0)  # the tiny model stands in for a pretrained one: its plan, LoRA
    # no core to spare: every stage in this process, in order (the --resume below stops inside iterated PPO)
    monkeypatch.setattr(support.os, "cpu_count", lambda: 1)
    out = tmp_path / "demo"
    flags = ["--output-dir", str(out), "--quick", "--progress", "false", "--model", str(tiny_model_dir)]
    assert main(["demo", *flags]) == 0
    summary = json.loads((out / "summary.json").read_text())
    # every stage saved its LoRA adapter alone, on the model it started from; iterated PPO's policy adapter
    # trained on from round to round, on the SFT model
    assert not list(out.rglob("model.safetensors")) and not list(out.rglob("actor_critic.safetensors"))
    sft = str((out / "sft").resolve())
    assert loading.adapter_base(str(out / "sft")) == str(tiny_model_dir.resolve())
    assert all(loading.adapter_base(str(out / name)) == sft for name in ("rm", "ppo", "dpo"))
    assert loading.adapter_base(str(out / "iterated" / "round-2" / "ppo")) == sft
    assert loading.adapter_base(str(out / "online_dpo" / "final")) == sft
    assert summary["model"] == str(tiny_model_dir)
    assert "init-model" not in summary["stage_seconds"] and not (out / "base").exists()
    sft_config = yaml.safe_load((out / "sft" / "config.yaml").read_text())
    assert sft_config["model"] == str(tiny_model_dir) and sft_config["threads"] == 1  # no core to spare
    # iterated PPO runs on a given model too, continuing from its SFT stage
    assert "iterated PPO" in summary["stage_seconds"] and "gold/iterated" in summary
    assert yaml.safe_load((out / "iterated" / "config.yaml").read_text())["model"] == str(out / "sft")
    # on a given model the beta = 0 run is left out unless asked for (--kl-ablation true)
    assert "gold/ppo_no_kl" not in summary and not (out / "ppo_no_kl").exists()
    assert not any("beta = 0" in stage for stage in summary["stage_seconds"])
    assert set(summary["gold_diff_se"]) >= {"ppo-sft", "dpo-sft", "iterated-dpo"} and summary["seed"] == 0
    report = (out / "report.md").read_text()
    assert "| PPO (beta = 0) |" not in report and "PPO without KL" not in report
    assert f"A pretrained language model (`{tiny_model_dir}`)" in report and "## Settings" in report
    assert "trained from scratch" not in report
    assert main(["demo", "--task", "arithmetic", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path)]) == 1
    assert "runs the support task" in capsys.readouterr().err

    # --resume: a demo stopped inside iterated PPO's last round continues that round; the stages it finished are
    # kept, not run again, with their earlier times; the stage's time counts the first reward model and the rounds
    # the earlier run finished
    record = json.loads((out / "stages.json").read_text())
    names = list(record["stages"])
    assert names == list(summary["stage_seconds"])
    iterated = json.loads((out / "iterated" / "summary.json").read_text())
    assert iterated["first_reward_model_seconds"] > 0 and len(iterated["rounds"]) == 2
    done_before = iterated["first_reward_model_seconds"] + iterated["rounds"][0]["seconds"]
    cut = names.index("iterated PPO")
    record["stages"] = {n: record["stages"][n] for n in names[:cut]}
    (out / "stages.json").write_text(json.dumps(record))
    (out / "iterated" / "round-2" / "round.json").unlink()
    iterated["rounds"] = iterated["rounds"][:1]
    iterated["totals"]["seconds"] = round(done_before, 1)
    (out / "iterated" / "summary.json").write_text(json.dumps(iterated))
    sft_weights = (out / "sft" / "adapter_model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert main(["demo", *flags, "--resume"]) == 0
    took = time.perf_counter() - start
    printed = capsys.readouterr()
    console = console_lines(printed.err)
    assert [line.split(":")[0] for line in console if line.startswith("kept")] == [f"kept {n}" for n in names[1:cut]]
    assert "round 2:" in printed.err and "round 1:" not in printed.err  # round 1 is not redone
    assert "of it by an earlier run" in printed.err
    assert (out / "sft" / "adapter_model.safetensors").stat().st_mtime_ns == sft_weights
    resumed = json.loads((out / "summary.json").read_text())
    assert list(resumed["stage_seconds"]) == names
    assert resumed["stage_seconds"]["SFT"] == summary["stage_seconds"]["SFT"]  # the earlier run's time
    assert resumed["seconds"] >= sum(summary["stage_seconds"][n] for n in names[1:cut])
    assert round(done_before, 1) <= resumed["stage_seconds"]["iterated PPO"] <= round(done_before, 1) + took
    assert len(json.loads((out / "iterated" / "summary.json").read_text())["rounds"]) == 2
    # only the same run continues
    assert main(["demo", *flags, "--resume", "--seed", "1"]) == 1
    assert "holds a demo run with other settings" in capsys.readouterr().err


def test_paired_standard_errors_take_the_differences_reply_by_reply():
    from rlhfkit.demo.report import paired_standard_errors

    rows = lambda golds: [{"gold": g} for g in golds]  # noqa: E731
    # b is a plus 1 on every reply: the difference has no spread, however much the prompts differ
    got = paired_standard_errors({"a": rows([0.0, 5.0, -3.0]), "b": rows([1.0, 6.0, -2.0]), "c": rows([0.0, 1.0, 2.0])})
    assert got["b-a"] == 0.0
    assert got["c-a"] == pytest.approx(statistics.stdev([0.0, -4.0, 5.0]) / math.sqrt(3))
    assert set(got) == {"b-a", "c-a", "c-b"}
    assert math.isnan(paired_standard_errors({"a": rows([1.0]), "b": rows([2.0])})["b-a"])


def test_resumed_stages_are_kept_once_with_their_earlier_times(tmp_path, capsys):
    from rlhfkit.demo.stages import Stages
    from rlhfkit.errors import UserError

    record = tmp_path / "stages.json"
    first = Stages(total=3, record=record, identity={"seed": 0})
    first.run("a", lambda: 1)
    first.run("b", lambda: 2)
    saved = json.loads(record.read_text())
    assert list(saved["stages"]) == ["a", "b"] and saved["identity"] == {"seed": 0}

    again = Stages(total=3, record=record, identity={"seed": 0}, resume=True)
    assert again.start("a", "ppo", "--help", tmp_path / "a.log", 1) is None  # kept: no child started
    assert not (tmp_path / "a.log").exists()
    assert again.run("b", lambda: 1 / 0) is None  # kept: not run
    assert again.run("c", lambda: 3) == 3
    assert again.done == 3 and list(again.seconds) == ["a", "b", "c"]
    assert again.earlier_seconds == saved["stages"]["a"]["seconds"] + saved["stages"]["b"]["seconds"]
    console = console_lines(capsys.readouterr().err)
    assert sum(line.startswith("kept") for line in console) == 2
    # without --resume the record starts again; with another identity --resume is refused
    Stages(total=1, record=record, identity={"seed": 0}).run("z", lambda: 0)
    assert list(json.loads(record.read_text())["stages"]) == ["z"]
    with pytest.raises(UserError, match="other settings"):
        Stages(total=1, record=record, identity={"seed": 1}, resume=True)


def test_each_stage_records_the_code_that_ran_it_and_a_kept_stage_keeps_its_own(tmp_path, monkeypatch):
    from rlhfkit import __version__  # the installed package's version, as its metadata says
    from rlhfkit.demo import stages as stages_module
    from rlhfkit.demo.stages import Stages, code_version

    assert code_version().startswith(f"rlhfkit {__version__}")
    record = tmp_path / "stages.json"
    monkeypatch.setattr(stages_module, "code_version", lambda: "rlhfkit 0.1.0, git aaaa")
    Stages(total=2, record=record, identity={"seed": 0}).run("a", lambda: 1)
    saved = json.loads(record.read_text())
    saved["stages"]["old"] = {"seconds": 1.0, "load": 0.0}  # a record written before stages named their code
    record.write_text(json.dumps(saved))
    monkeypatch.setattr(stages_module, "code_version", lambda: "rlhfkit 0.1.0, git bbbb")
    again = Stages(total=3, record=record, identity={"seed": 0}, resume=True)
    again.run("a", lambda: 1 / 0)
    again.run("old", lambda: 1 / 0)
    again.run("b", lambda: 2)
    assert again.code == {"a": "rlhfkit 0.1.0, git aaaa", "old": None, "b": "rlhfkit 0.1.0, git bbbb"}
    assert json.loads(record.read_text())["stages"]["b"]["code"] == "rlhfkit 0.1.0, git bbbb"


def test_a_demo_stops_before_its_first_stage_when_the_disk_cannot_hold_its_models(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    from rlhfkit.demo import support
    from rlhfkit.demo.plan import PRETRAINED, Plan, model_size

    # a 135M-parameter model: SFT, RM, PPO, DPO, online DPO's first, final and 2 rounds' policies, and iterated
    # PPO's first RM, final policy and 2 rounds of (RM, policy; no value model: the plan's leave-one-out
    # advantages need none): each saved whole in float32 when the stages save merged models, or as a LoRA
    # adapter (the plan's own choice)
    merged = {name: {**stage, "save_merged": True} for name, stage in PRETRAINED.items()}
    smol = Plan(merged, None, 40, 2, parameters=135_000_000)
    assert support.disk_needed(smol, ablation=False) == 4 * 135_000_000 * 14
    assert support.disk_needed(smol, ablation=True) == 4 * 135_000_000 * 15
    critic = {**merged, "iterate": {**merged["iterate"], "advantage": "gae"}}  # a value model each round
    assert support.disk_needed(Plan(critic, None, 40, 2, parameters=135_000_000), False) == 4 * 135_000_000 * 16
    half_smol = Plan(merged, None, 40, 2, parameters=135_000_000, parameter_bytes=2)  # bfloat16
    assert support.disk_needed(half_smol, ablation=False) == 2 * 135_000_000 * 14
    adapters = Plan(PRETRAINED, None, 40, 2, parameters=135_000_000)
    assert support.disk_needed(adapters, ablation=False) == int(4 * 135_000_000 * 14 * support.ADAPTER_SHARE)
    assert support.disk_needed(Plan(PRETRAINED, None, 40, 2), ablation=True) == 0  # the built-in model
    assert model_size(str(tiny_model_dir))[1] == 4
    config = json.loads((tiny_model_dir / "config.json").read_text())
    half = tmp_path / "half"
    shutil.copytree(tiny_model_dir, half)
    (half / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16", "torch_dtype": "bfloat16"}))
    assert model_size(str(half))[1] == 2

    free = 10_000
    asked = []

    def disk_usage(path):
        asked.append(Path(path))
        return SimpleNamespace(total=10**6, used=10**6 - free, free=free)

    monkeypatch.setattr(support.shutil, "disk_usage", disk_usage)
    out = tmp_path / "demo"
    support.check_disk(out, free)
    assert asked == [tmp_path]  # a missing output dir: the disk of its nearest existing parent
    with pytest.raises(support.UserError, match="GiB free"):
        support.check_disk(out, free + 1)
    # what an earlier run already wrote there (a --resume) counts as written
    out.mkdir()
    (out / "model.safetensors").write_bytes(bytes(4096))
    support.check_disk(out, free + 4096)
    asked.clear()
    support.check_disk(out, 0)  # the built-in model: nothing to check
    assert asked == []

    # through the command line: nothing runs, and the message says what to do
    free = 1024
    flags = ["--output-dir", str(tmp_path / "full"), "--quick", "--progress", "false", "--model", str(tiny_model_dir)]
    assert main(["demo", *flags]) == 1
    err = capsys.readouterr().err
    assert "GiB free" in err and "--output-dir" in err
    assert not (tmp_path / "full").exists()


def test_the_report_sets_the_reward_model_against_the_judge(tmp_path):
    from rlhfkit.demo.report import write_report

    stages = SimpleNamespace(seconds={"SFT": 3.0}, load={"SFT": 1.0}, beside={})
    results = fake_results({"sft": 0.0, "ppo": 1.0, "dpo": 2.0})
    diagnostics = {
        "held_out": {"rm/pairs_accuracy": 0.7, "judge/pairs_accuracy": 0.8, "rm_judge/pairs_agreement": 0.75},
        "policies": {
            "sft": {
                "rm_judge/on_policy_agreement": 0.55,
                "rm_judge/on_policy_pairs": 100.0,
                "best_of_n/n": 4.0,
                "best_of_n/prompts": 50.0,
                "best_of_n/random": 2.0,
                "best_of_n/rm_pick": 2.25,
                "best_of_n/judge_pick": 3.0,
                "best_of_n/captured": 0.25,
            },
            "ppo": {"rm_judge/on_policy_agreement": 0.5, "rm_judge/on_policy_pairs": 80.0},
        },
    }
    summary = write_report(tmp_path, results, 0.8, stages, 60.0, diagnostics=diagnostics)
    assert summary["diagnostics"] == diagnostics
    report = (tmp_path / "report.md").read_text()
    assert "agrees with the labels on 70% (the judge itself on 80%" in report
    assert "with the judge's ranking on 75%" in report
    assert "| SFT | 55% | 100 |" in report and "| PPO (KL on) | 50% | 80 |" in report
    assert "Best-of-4 on the SFT model (50 held-out prompts)" in report and "**25%**" in report
    # without diagnostics the section is left out
    write_report(tmp_path, results, 0.8, stages, 60.0)
    assert "How far the reward model carries" not in (tmp_path / "report.md").read_text()


def test_the_gold_reward_run_is_called_a_ceiling_only_when_it_is_one():
    from rlhfkit.demo.reward_carry import ceiling_text

    def moved(name):
        return name

    below = ceiling_text({"sft": 3.0, "ppo": 3.5, "ppo_gold": 4.0}, moved)
    assert "when the reward is right; PPO on the reward model took 50%." in below
    above = ceiling_text({"sft": 3.0, "ppo": 4.5, "ppo_gold": 3.6}, moved)
    assert "no ceiling here" in above and "took" not in above
    flat = ceiling_text({"sft": 3.0, "ppo": 3.5, "ppo_gold": 2.9}, moved)
    assert "gained nothing" in flat
