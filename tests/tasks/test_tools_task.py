"""The built-in tools task: problems and the held-out set, the conversations, the reward and the gold judge,
the tool file, and a trainer that finds all of them by name."""

from __future__ import annotations

import json
import random

import pytest

from rlhfkit.multiturn.tools import load_tools, parse_tool_calls, run_tool_calls
from rlhfkit.tasks import get_judge, get_task
from rlhfkit.tasks.tools import (
    DIGITS,
    EVAL_PROBLEMS,
    TERMS,
    TOOL_RATE,
    Problem,
    add,
    corpus_text,
    eval_problems,
    exact_answer,
    guess,
    judge,
    make_prompt_rows,
    make_sft_rows,
    parse_answer,
    parse_prompt,
    tool_call,
    train_problems,
    write_task_data,
)

SUM = Problem((1234, 567, 8910))

# ---------------------------------------------------------------- problems


def test_a_problem_is_its_numbers_their_sum_and_one_user_message():
    assert SUM.answer == 10711 and SUM.text == "1234 + 567 + 8910"
    assert SUM.prompt == [{"role": "user", "content": "1234 + 567 + 8910"}]
    rng = random.Random(0)
    for p in train_problems(rng, 200):
        assert len(p.numbers) == TERMS and all(len(str(n)) in DIGITS for n in p.numbers)
    lengths = {len(str(n)) for p in train_problems(rng, 200) for n in p.numbers}
    assert lengths == set(DIGITS)


def test_the_held_out_set_is_fixed_distinct_and_never_trained_on():
    held_out = eval_problems()
    assert len(held_out) == len(set(held_out)) == EVAL_PROBLEMS
    assert eval_problems() == held_out
    trained = {parse_prompt(r["messages"][0]["content"]) for r in make_sft_rows()}
    prompted = {parse_prompt(r["prompt"]) for r in make_prompt_rows()}
    assert not (trained | prompted) & set(held_out)


@pytest.mark.parametrize(
    "prompt, numbers",
    [
        ("1234 + 567 + 8910", (1234, 567, 8910)),
        ("User: 1234 + 567 + 8910\nAssistant:", (1234, 567, 8910)),  # a conversation rendered as text
        ("User: 1 + 2\nAssistant: 3\nUser: 12+ 30 +4\nAssistant:", (12, 30, 4)),  # the last sum counts
        ([{"role": "user", "content": "5 + 6"}, {"role": "assistant", "content": "11"}], (5, 6)),
    ],
)
def test_the_sum_is_parsed_from_the_prompt(prompt, numbers):
    assert parse_prompt(prompt) == Problem(numbers)


def test_a_prompt_without_a_sum_parses_to_none():
    assert parse_prompt("what is 12?") is None and parse_prompt(None) is None and parse_prompt([]) is None


# ---------------------------------------------------------------- the tool and the conversations


def test_the_tool_adds_and_its_schema_names_a_list_of_integers():
    assert add([1234, 567, 8910]) == 10711 and add([]) == 0
    (tool,) = load_tools([add])
    params = tool.schema["function"]["parameters"]
    assert tool.name == "add" and params["required"] == ["numbers"]
    assert params["properties"]["numbers"] == {
        "type": "array",
        "items": {"type": "integer"},
        "description": "the numbers to add",
    }


def test_a_demonstrated_call_parses_and_the_tool_answers_the_sum():
    text = tool_call(SUM)
    assert text == '<tool_call>{"name": "add", "arguments": {"numbers": [ 1234, 567, 8910]}}</tool_call>'
    (call,) = parse_tool_calls(text)
    assert call.name == "add" and call.arguments == {"numbers": [1234, 567, 8910]}
    (result,) = run_tool_calls([call], {t.name: t for t in load_tools([add])}, timeout=5.0)
    assert result.content == "10711" and not result.error


def test_demonstrations_call_the_tool_and_copy_its_result_or_guess_wrong():
    rows = make_sft_rows(seed=3, n=1000)
    calls = 0
    for row in rows:
        user, first, *rest = row["messages"]
        problem = parse_prompt(user["content"])
        if rest:  # the tool's answer, then the final reply copies it
            calls += 1
            assert first == {"role": "assistant", "content": tool_call(problem)}
            assert rest == [
                {"role": "tool", "content": str(problem.answer)},
                {"role": "assistant", "content": str(problem.answer)},
            ]
        else:  # a guess: the right hundreds, wrong last two digits
            value = int(first["content"])
            assert value != problem.answer and value // 100 == problem.answer // 100
    assert abs(calls / len(rows) - TOOL_RATE) < 0.05
    assert make_sft_rows(seed=3, n=1000) == rows and make_sft_rows(seed=4, n=1000) != rows
    assert all("tool" not in [m["role"] for m in r["messages"]] for r in make_sft_rows(n=50, tool_rate=0.0))


def test_a_guess_is_never_the_answer():
    rng = random.Random(0)
    assert all(guess(rng, a) != a and guess(rng, a) // 100 == a // 100 for a in (0, 99, 100, 10711) for _ in range(50))


def test_eval_demonstrations_use_the_held_out_sums():
    rows = make_sft_rows(n=2 * EVAL_PROBLEMS + 1, split="eval")
    assert [parse_prompt(r["messages"][0]["content"]) for r in rows[:EVAL_PROBLEMS]] == list(eval_problems())
    with pytest.raises(ValueError, match="split"):
        make_sft_rows(split="test")


def test_the_corpus_holds_the_tool_call_and_every_role_of_the_plain_template():
    text = corpus_text()
    assert '<tool_call>{"name": "add", "arguments": {"numbers": [ ' in text
    assert {line.split(":")[0] for line in text.splitlines()} == {"User", "Assistant", "Tool"}


def test_write_task_data_writes_every_file_and_the_tool(tmp_path):
    files = write_task_data(tmp_path, seed=1, sizes={"sft": 30, "sft_eval": 5, "prompts_train": 12})
    assert set(files) == {"sft", "sft_eval", "prompts_train", "prompts_eval", "corpus", "tool"}
    lines = {k: files[k].read_text().splitlines() for k in ("sft", "sft_eval", "prompts_train", "prompts_eval")}
    assert [len(v) for v in lines.values()] == [30, 5, 12, EVAL_PROBLEMS]
    for line in lines["prompts_train"] + lines["prompts_eval"]:
        row = json.loads(line)
        assert row["answer"] == parse_prompt(row["prompt"]).answer
    (tool,) = load_tools([f"{files['tool']}:add"])  # as --tool DATA/calculator.py:add names it
    assert tool.fn([1, 2, 3]) == 6
    with pytest.raises(ValueError, match="unknown size names"):
        write_task_data(tmp_path, sizes={"prefs_train": 3})


# ---------------------------------------------------------------- reward and judge


@pytest.mark.parametrize(
    "reply, value",
    [(" 10711", 10711), ("10711\n", 10711), ("-3", -3), ("10711.", None), ("10711 10711", None), ("", None),
     (None, None), (tool_call(SUM), None), ([{"role": "assistant", "content": " 42"}], 42)],
)  # fmt: skip
def test_a_well_formed_reply_is_one_number(reply, value):
    assert parse_answer(reply) == value


def test_exact_answer_checks_the_answer_column_or_else_the_prompt():
    prompts = [SUM.prompt, SUM.prompt, [{"role": "user", "content": "hello"}]]
    replies = [" 10711", " 10712", " 5"]
    assert exact_answer(prompts, replies, answer=[10711, "10711", 5]) == [1.0, 0.0, 1.0]
    assert exact_answer(prompts, replies, answer=[10711, 10711, None]) == [1.0, 0.0, None]
    assert exact_answer(prompts, replies, messages=[[], [], []]) == [1.0, 0.0, None]  # no column: the sum asked
    with pytest.raises(ValueError, match="answer\\[0\\]"):
        exact_answer(prompts[:1], replies[:1], answer=["ten"])
    with pytest.raises(ValueError, match="align"):
        exact_answer(prompts, replies, answer=[1])


def test_the_gold_judge_reads_the_sum_from_the_prompt_text():
    assert get_judge("tools") is judge
    assert judge("User: 1234 + 567 + 8910\nAssistant:", " 10711") == 1.0
    assert judge("User: 1234 + 567 + 8910\nAssistant:", " 10712") == 0.0
    assert judge(SUM.prompt, tool_call(SUM)) == 0.0  # a reply that still calls the tool answers nothing
    with pytest.raises(ValueError, match="no sum"):
        judge("hello", " 1")


def test_the_task_is_registered_with_its_reward():
    from rlhfkit.trainers.online.rewards import load_function

    task = get_task("tools")
    assert task.reward_functions == {"exact_answer": exact_answer} and task.score_range == (0.0, 1.0)
    assert load_function("tools:exact_answer").name == "tools_exact_answer"
