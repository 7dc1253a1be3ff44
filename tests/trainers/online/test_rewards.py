"""Rewards as one protocol: functions called as TRL calls them (each shape of its documentation), their
signatures checked up front, built-in task rewards by name, the weighted sum."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from rlhfkit.config.online import OnlineRewardArgs
from rlhfkit.errors import UserError
from rlhfkit.trainers.online.rewards import (
    FunctionReward,
    RewardBatch,
    Rewards,
    TrainerState,
    build_rewards,
    check_signature,
    load_function,
)


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
    half = FunctionReward(lambda completions, **k: [None, 1.0, None], "half")
    other = FunctionReward(lambda completions, **k: [2.0, 3.0, None], "other")
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
        FunctionReward(lambda completions, **k: "ab", "text")(batch(["a", "b"]))
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


# TRL's documented reward-function shapes, as its users write them.


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def starts_with_prompt_word(prompts, completions, **kwargs):
    return [float(c.split()[0] in p) if c.split() else 0.0 for p, c in zip(prompts, completions)]


def format_reward_func(completions, **kwargs):
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if c.startswith("<think>") else 0.0 for c in contents]


def accuracy_reward(completions, ground_truth, **kwargs):
    return [1.0 if c[0]["content"].strip() == gt else 0.0 for c, gt in zip(completions, ground_truth)]


def token_budget(completion_ids, **kwargs):
    return [1.0 if len(ids) <= 2 else 0.0 for ids in completion_ids]


async def remote_judge(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def warm_up(completions, trainer_state, **kwargs):
    return [float(trainer_state.global_step) / trainer_state.max_steps] * len(completions)


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


def test_plain_prompts_give_string_completions_by_keyword():
    b = batch([" 12345", " the answer is 4"], prompts=["say the answer", "the answer?"])
    assert reward_len(**b.function_arguments()) == [-14, -4]
    assert FunctionReward(reward_len)(b)[0].tolist() == [-14.0, -4.0]
    assert FunctionReward(starts_with_prompt_word)(b)[0].tolist() == [0.0, 1.0]


def test_chat_prompts_give_completions_as_assistant_message_lists():
    b = RewardBatch(
        [CHAT, CHAT, CHAT], ["<think>4</think> 4", "4", " 5"], [[7, 8], [9], [10, 11, 12]], [True] * 3,
        {"ground_truth": ["4", "4", "4"]}, [0, 0, 0],
    )  # fmt: skip
    args = b.function_arguments()
    assert args["prompts"] == [CHAT] * 3
    assert args["completions"][1] == [{"role": "assistant", "content": "4"}]
    assert args["completion_ids"] == [[7, 8], [9], [10, 11, 12]] and args["ground_truth"] == ["4", "4", "4"]
    assert FunctionReward(format_reward_func)(b)[0].tolist() == [1.0, 0.0, 0.0]
    assert FunctionReward(accuracy_reward)(b)[0].tolist() == [0.0, 1.0, 0.0]  # an extra column by its name
    assert FunctionReward(token_budget)(b)[0].tolist() == [1.0, 1.0, 0.0]  # completion_ids only
    assert FunctionReward(remote_judge)(b)[0].tolist() == [1.0, 1.0, 1.0]  # async: awaited; one message each


def test_trainer_state_tells_the_function_where_the_run_is():
    rewards = Rewards([FunctionReward(warm_up)], None, OnlineRewardArgs(reward_clip=None))
    rewards.state = TrainerState(global_step=3, max_steps=12)
    assert rewards(batch(["a", "b"])).total.tolist() == [0.25, 0.25]


def test_a_multi_turn_rollout_gives_its_opening_and_every_message_after_it():
    opening = [{"role": "user", "content": "what is 2 + 3?"}]
    conversation = opening + [
        {"role": "assistant", "content": '<tool_call>{"name": "add"}</tool_call>'},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]
    b = RewardBatch(
        [conversation[:-1]], ["5"], [[5]], [True], {"answer": ["5"]}, [0],
        messages=[conversation], openings=[1], conversation_ids=[[1, 2, 3, 4, 5]],
    )  # fmt: skip
    args = b.function_arguments()
    assert args["prompts"] == [opening] and args["completions"] == [conversation[1:]]
    assert args["completion_ids"] == [[1, 2, 3, 4, 5]] and args["answer"] == ["5"]
    assert load_function("tools")(b)[0].tolist() == [1.0]  # the built-in reward reads the final reply


def test_a_signature_the_call_cannot_fill_is_named_with_what_it_lacks(tmp_path):
    (tmp_path / "rewards.py").write_text(
        "def old_style(p, c, **kwargs):\n    return [0.0] * len(c)\n\n"
        "def no_kwargs(prompts, completions):\n    return [0.0] * len(completions)\n\n"
        "def needs_answer(completions, answer, **kwargs):\n    return [0.0] * len(completions)\n\n"
        "def positional_only(completions, /, **kwargs):\n    return [0.0] * len(completions)\n"
    )
    path = tmp_path / "rewards.py"

    def check(name, columns=()):
        args = OnlineRewardArgs(reward_fn=[f"{path}:{name}"])
        return build_rewards(args, "prompts.jsonl", columns=columns)

    with pytest.raises(UserError) as raised:
        check("old_style", ["answer"])
    assert str(raised.value) == (
        f"{path}:1: reward function 'old_style' needs 'p', which it is not given: it is called with prompts, "
        "completions, completion_ids, trainer_state and the columns of prompts.jsonl (answer)"
    )
    with pytest.raises(UserError, match=r"rewards.py:4: reward function 'no_kwargs' has no \*\*kwargs but is "
                       r"also called with completion_ids, trainer_state, answer: add \*\*kwargs"):  # fmt: skip
        check("no_kwargs", ["answer"])
    with pytest.raises(UserError, match=r"'needs_answer' needs 'answer', .* the columns of prompts.jsonl \(none\)"):
        check("needs_answer")
    assert check("needs_answer", ["answer"]).names == ["needs_answer"]  # the column is there: fine
    with pytest.raises(UserError, match="has a positional-only parameter 'completions'"):
        check("positional_only")
    for shape in (reward_len, starts_with_prompt_word, format_reward_func, token_budget, remote_judge, warm_up):
        check_signature(shape, shape.__name__, [])
    check_signature(accuracy_reward, "accuracy_reward", ["ground_truth"])
    for task in ("arithmetic", "arithmetic:format", "support", "tools"):
        check_signature(load_function(task).fn, task, ["answer"])
