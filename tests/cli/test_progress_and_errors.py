"""An error ends a run on a line of its own: the progress bar is closed before the error line is printed."""

from __future__ import annotations

import json

from tests.helpers import run_cli

FAILING = """
def broken(prompts, completions, **kwargs):
    raise KeyError("answer")
"""


def test_the_progress_bar_is_closed_before_the_error_line(tiny_model_dir, tmp_path, capsys):
    (tmp_path / "rewards.py").write_text(FAILING)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Question: what does {n} want?"}) + "\n" for n in "ab"))
    code, _, err = run_cli(
        capsys, "grpo", "--model", tiny_model_dir, "--data", prompts, "--output-dir", tmp_path / "out",
        "--reward-fn", f"{tmp_path}/rewards.py:broken", "--batch-size", "4", "--num-generations", "2",
        "--max-new-tokens", "4", "--max-steps", "2", "--progress", "true",
    )  # fmt: skip
    assert code == 1
    assert "grpo" in err and ("it/s]" in err or "s/it]" in err)  # a bar was drawn
    before, _, after = err.partition("error: ")
    assert before.endswith("\n"), repr(err[-300:])  # the error starts a line: the bar ended its own first
    assert "reward function 'broken' raised KeyError" in after
    assert after.count("\n") == 1 and after.endswith("\n")  # and nothing is drawn after it
