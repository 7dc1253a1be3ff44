"""Rewards as one protocol: functions with TRL's signature, built-in task rewards by name, the weighted sum."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from rlhfkit.config.online import OnlineRewardArgs
from rlhfkit.errors import UserError
from rlhfkit.trainers.online.rewards import FunctionReward, RewardBatch, Rewards, load_function


def batch(completions, prompts=None, finished=None, **columns) -> RewardBatch:
    prompts = prompts or ["Q: 1+1=\nA:"] * len(completions)
    finished = finished or [True] * len(completions)
    return RewardBatch(prompts, completions, [[1]] * len(completions), finished, columns, list(range(len(prompts))))


class FixedModel:
    """A reward-model stand-in: fixed raw scores (NaN allowed), the abstain rule of a reward model."""

    name, abstains = "reward_model", False

    def __init__(self, scores):
        self.scores = torch.tensor(scores)

    def __call__(self, b):
        return self.scores.clone(), self.scores.clone()


def test_built_in_task_rewards_by_name():
    exact = load_function("arithmetic")
    assert exact.name == "arithmetic"
    raw, _ = exact(batch([" 2", " 3", " 2 2"], answer=["2", "2", "2"]))
    assert raw.tolist() == [1.0, 0.0, 0.0]
    fmt = load_function("arithmetic:format")
    assert fmt.name == "arithmetic_format" and fmt(batch([" 3"]))[0].tolist() == [1.0]
    gold = load_function("support")
    assert gold.name == "support"
    with pytest.raises(UserError, match="unknown task 'nosuch'"):
        load_function("nosuch")
    with pytest.raises(UserError, match="has exact_answer, format, not 'nope'"):
        load_function("arithmetic:nope")
    with pytest.raises(UserError, match="give the function as FILE.py:NAME"):
        load_function("rewards.py")


def test_weighted_sum_skips_none_and_marks_rows_no_reward_applies_to():
    half = FunctionReward(lambda p, c, **k: [None, 1.0, None], "half")
    other = FunctionReward(lambda p, c, **k: [2.0, 3.0, None], "other")
    out = Rewards([half, other], [1.0, 0.5], OnlineRewardArgs(reward_clip=None))(batch(["a", "b", "c"]))
    assert out.score[:2].tolist() == [1.0, 2.5] and math.isnan(out.score[2])
    assert out.total.tolist() == [1.0, 2.5, 0.0] and out.valid.tolist() == [True, True, False]
    assert math.isnan(out.components["half"][0]) and out.components["other"][1] == 3.0


def test_penalty_and_clip_apply_to_the_total_and_a_models_nan_is_not_an_abstention():
    args = OnlineRewardArgs(reward_clip=2.0, missing_eos_penalty=1.5)
    out = Rewards([FixedModel([3.0, 0.5, 0.5])], None, args)(batch(["a", "b", "c"], finished=[True, True, False]))
    assert out.total.tolist() == [2.0, 0.5, -1.0]  # clipped; unpenalised; penalised (cut off)
    out = Rewards([FixedModel([float("nan"), 1.0])], None, OnlineRewardArgs())(batch(["a", "b"]))
    assert out.valid.tolist() == [True, True] and math.isnan(out.total[0])  # reaches the finiteness check


def test_a_function_that_breaks_its_contract_names_itself_and_the_row():
    def wrong(prompts, completions, **kwargs):
        return [0.5, float("inf")]

    with pytest.raises(UserError, match=r"data\.jsonl: row 2: reward function 'wrong' returned inf"):
        FunctionReward(wrong, data_path="data.jsonl")(batch(["a", "b"]))
    with pytest.raises(UserError, match="returned str, not a list of 2 numbers"):
        FunctionReward(lambda p, c, **k: "ab", "text")(batch(["a", "b"]))
    with pytest.raises(UserError, match="two rewards are named same"):
        Rewards([FunctionReward(len, "same"), FunctionReward(len, "same")], None, OnlineRewardArgs())


def test_a_reward_file_imports_a_helper_module_beside_it(tmp_path):
    (tmp_path / "scoring_helpers_beside.py").write_text("def bonus(text):\n    return float('thanks' in text)\n")
    (tmp_path / "rewards.py").write_text(
        "import scoring_helpers_beside\n\n"
        "def polite(prompts, completions, **kwargs):\n"
        "    return [scoring_helpers_beside.bonus(c) for c in completions]\n"
    )
    polite = load_function(f"{tmp_path / 'rewards.py'}:polite")
    assert polite(batch(["thanks!", "no"]))[0].tolist() == [1.0, 0.0]


def test_a_config_recording_a_python_callable_says_to_give_it_again(tmp_path):
    from rlhfkit.config.commands import GRPOConfig
    from rlhfkit.config.parse import parse_config, save_config

    def exact(prompts, completions, **kwargs):
        return [1.0] * len(completions)

    config, _ = parse_config(
        "rlhfkit grpo", GRPOConfig, ["--model", "m", "--data", "d", "--output-dir", "o", "--reward-fn", "arithmetic"]
    )
    config.reward.reward_fn = [exact]
    text = save_config(config, tmp_path).read_text()
    assert text.startswith("# reward_fn: Python callables given through the Python API, recorded by name only.")
    assert "--reward-fn" in text.splitlines()[1]
    recorded = yaml.safe_load(text)["reward_fn"]
    with pytest.raises(UserError, match=r"was given a Python callable.*give it again, as FILE.py:NAME"):
        load_function(recorded[0])
