"""`rlhfkit demo --task tools`: the quick run wires init-model -> SFT -> GRPO with the tool -> evaluation and
writes its report; the report's numbers are the conversations' own; and GRPO with the tool and the
exact-answer reward does teach a policy to call it (in the long tier, `make test-long`)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rlhfkit.cli.main import main


def test_quick_tools_demo_runs_every_stage_and_reports_conversations(tmp_path, capsys):
    from rlhfkit.demo.report import QUICK_RUN

    out = tmp_path / "tools"
    assert main(["demo", "--task", "tools", "--output-dir", str(out), "--quick", "--progress", "false"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["quick"] is True and summary["conversations"] == 100
    for name in ("sft", "grpo"):
        assert 0.0 <= summary[f"accuracy/{name}"] <= 1.0 and 0.0 <= summary[f"tool_use/{name}"] <= 1.0
        assert summary[f"tool_errors/{name}"] >= 0 and summary[f"turns/{name}"] >= 1
    assert list(summary["stage_seconds"]) == [
        "task data", "init-model", "SFT", "GRPO (the add tool, exact-answer reward)", "evaluation on held-out sums"
    ]  # fmt: skip
    report = (out / "report.md").read_text()
    assert report.startswith("# rlhfkit demo: learning to use a tool") and report.splitlines()[2] == QUICK_RUN
    assert "went from" not in report and "| GRPO |" in report and "**644 + 528 + 396**" in report
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"report: {(out / 'report.md').resolve()}"
    assert (out / "grpo_curves.png").read_bytes()[:4] == b"\x89PNG"
    # GRPO ran multi-turn with the task's tool file and logged the conversations and the gold judge
    config = (out / "grpo" / "config.yaml").read_text()
    assert f"{out}/data/calculator.py:add" in config and "tools:exact_answer" in config
    rows = [json.loads(x) for x in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert "rollout/tool_calls" in rows[-1] and "reward/tools_exact_answer" in rows[-1] and "reward/gold" in rows[-1]


def test_the_tools_task_trains_its_own_model(tiny_model_dir, tmp_path, capsys):
    assert main(["demo", "--task", "tools", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path)]) == 1
    assert "the tools task trains its own model" in capsys.readouterr().err


def conversation(prompt: str, reply: str, tool: str | None = None) -> dict:
    messages = [{"role": "user", "content": prompt}]
    if tool is not None:
        messages += [{"role": "assistant", "content": "<tool_call>...</tool_call>"}, {"role": "tool", "content": tool}]
    return {"prompt": prompt, "messages": [*messages, {"role": "assistant", "content": reply}]}


def test_the_summary_counts_tool_use_and_accuracy_by_hand():
    from rlhfkit.demo.tools import conversation_summary

    samples = [
        {"gold": 1.0, "tool_calls": 1, "tool_errors": 0},
        {"gold": 0.0, "tool_calls": 2, "tool_errors": 1},
        {"gold": 0.0, "tool_calls": 0, "tool_errors": 0},
        {"gold": 1.0, "tool_calls": 1, "tool_errors": 0},
    ]
    assert conversation_summary(samples) == {
        "n": 4.0,
        "accuracy": 0.5,
        "tool_use": 0.75,
        "accuracy/with_tool": 2 / 3,
        "accuracy/without_tool": 0.0,
        "tool_errors": 1.0,
    }
    alone = conversation_summary(samples[:1])
    assert alone["accuracy/without_tool"] != alone["accuracy/without_tool"]  # NaN: no such conversation


def test_full_and_quick_reports_of_the_tools_task(tmp_path):
    from rlhfkit.demo.report import QUICK_RUN
    from rlhfkit.demo.tools import conversation_summary, write_report

    def result(used: bool, right: bool) -> dict:
        sample = conversation("1 + 2 + 3", " 6" if right else " 7", tool="6" if used else None)
        sample.update(gold=float(right), tool_calls=int(used), tool_errors=0)
        turns = {"rollout/turns": 1.0 + used, "rollout/truncated": 0.0}
        return {"metrics": {**conversation_summary([sample]), **turns}, "samples": [sample]}

    results = {"sft": result(False, False), "grpo": result(True, True)}
    stages = SimpleNamespace(seconds={"SFT": 3.0}, load={"SFT": 1.0})
    summary = write_report(tmp_path, results, stages, 120.0)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["quick"] is False and saved["accuracy/sft"] == 0.0 and saved["accuracy/grpo"] == 1.0
    assert saved["tool_use/grpo"] == 1.0 and saved["accuracy/with_tool/sft"] is None  # no SFT conversation used it
    assert summary["plots"] == ["grpo_curves.png"]
    report = (tmp_path / "report.md").read_text()
    assert "went from **0.000** after SFT to **1.000** after GRPO" in report and "from **0.00** to **1.00**" in report
    assert "| SFT | 0.000 | 0.00 | — | 0.000 | 0 | 1.00 |" in report
    assert "- *GRPO* (right): assistant: `<tool_call>...</tool_call>` → tool: `6` → assistant: `6`" in report
    assert QUICK_RUN not in report

    write_report(tmp_path, results, stages, 20.0, quick=True)
    report = (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["quick"] is True
    assert report.splitlines()[2] == QUICK_RUN and "went from" not in report


@pytest.mark.long  # `make test-long`: 1,000 SFT steps and 30 GRPO steps of 64 conversations
def test_grpo_with_the_tool_raises_tool_use_and_accuracy(tmp_path):
    """From an SFT policy that calls the tool in about two thirds of its answers and copies the numbers into
    the call only part of the time, 30 GRPO steps on the exact-answer reward make it call the tool nearly
    always and get more sums right. Seeded: the numbers are the same run after run on one machine."""
    from rlhfkit.demo.tools import evaluate_conversations
    from rlhfkit.tasks.tools import make_sft_rows, write_task_data

    files = write_task_data(tmp_path / "data", sizes={"sft": 10, "prompts_train": 2000})
    with open(files["sft"], "w") as f:  # more tool calls than the demo's: the copying is learnt in fewer steps
        f.writelines(json.dumps(row) + "\n" for row in make_sft_rows(seed=0, n=8000, tool_rate=0.7))
    base, sft, grpo = (str(tmp_path / name) for name in ("base", "sft", "grpo"))
    seeded = ["--seed", "0", "--progress", "false"]
    assert main(["init-model", "--corpus", str(files["corpus"]), "--output-dir", base, "--seed", "0"]) == 0
    sft_flags = ["--max-steps", "1000", "--learning-rate", "6e-3", "--batch-size", "16", *seeded]
    assert main(["sft", "--model", base, "--data", str(files["sft"]), "--output-dir", sft, *sft_flags]) == 0
    grpo_flags = [
        "--max-steps", "30", "--learning-rate", "5e-4", "--batch-size", "64", "--num-generations", "8",
        "--max-new-tokens", "48", "--max-turns", "3", "--kl-coef", "0", "--tool", f"{files['tool']}:add",
        "--reward-fn", "tools:exact_answer", *seeded,
    ]  # fmt: skip
    assert main(["grpo", "--model", sft, "--data", str(files["prompts_train"]), "--output-dir", grpo, *grpo_flags]) == 0

    prompts = [json.loads(line)["prompt"] for line in files["prompts_eval"].read_text().splitlines()]
    before, after = (
        evaluate_conversations(policy, prompts, f"{files['tool']}:add")["metrics"] for policy in (sft, grpo)
    )
    assert 0.4 < before["tool_use"] < 0.85 and before["accuracy"] > 0.05  # the SFT policy does copy, sometimes
    assert after["tool_use"] > 0.9 and after["tool_use"] - before["tool_use"] > 0.15
    assert after["accuracy"] - before["accuracy"] > 0.1
    rows = [json.loads(x) for x in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["rollout/tool_calls"] > rows[0]["rollout/tool_calls"]
