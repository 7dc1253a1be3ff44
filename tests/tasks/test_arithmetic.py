"""The built-in arithmetic task: problems, prompt parsing, the checkable rewards, the data sets."""

from __future__ import annotations

import json
import re

import pytest

from rlhfkit.tasks import TASKS, get_judge, get_task
from rlhfkit.tasks.arithmetic import (
    MAX_OPERAND,
    RUN_ON_RATE,
    SLIP_RATE,
    Problem,
    accuracy,
    all_problems,
    corpus_text,
    exact_answer,
    format_prompt,
    format_reward,
    judge,
    make_problems,
    make_prompt_rows,
    make_sft_rows,
    parse_answer,
    parse_prompt,
    write_task_data,
)

PROMPT = "Q: 7+5=\nA:"
RUN_ON = re.compile(r" (\d+)\nQ: (\d+)([+-])(\d+)=\nA: (\d+)")

# ---------------------------------------------------------------- problems and prompts


def test_problem_set():
    problems = all_problems()
    n = MAX_OPERAND + 1
    assert len(problems) == n * n + n * (n + 1) // 2  # every sum, every difference a - b with a >= b
    assert len(set(problems)) == len(problems)
    assert all(p.answer >= 0 for p in problems)
    assert Problem(7, "+", 5).answer == 12 and Problem(7, "-", 5).answer == 2


def test_split_is_fixed_disjoint_and_covers_both_operators():
    train, eval_ = make_problems("train"), make_problems("eval")
    assert not set(train) & set(eval_)
    assert set(train) | set(eval_) == set(all_problems())
    assert {p.op for p in train} == {"+", "-"} == {p.op for p in eval_}
    assert 0.15 < len(eval_) / len(all_problems()) < 0.25
    assert make_problems("eval") == eval_
    with pytest.raises(ValueError, match="split"):
        make_problems("test")


def test_prompt_format_and_parser_round_trip():
    assert format_prompt(7, "+", 5) == PROMPT
    assert Problem(7, "+", 5).prompt == PROMPT
    for problem in all_problems():
        assert re.fullmatch(r"Q: \d+[+-]\d+=\nA:", problem.prompt)
        assert parse_prompt(problem.prompt) == problem
    with pytest.raises(ValueError, match="operator"):
        format_prompt(7, "*", 5)


@pytest.mark.parametrize(
    "prompt, expected",
    [
        ("Q: 12-3=\nA:", Problem(12, "-", 3)),
        ("Q: 7 + 5 =\nA:", Problem(7, "+", 5)),  # spaces allowed
        ("Q: 1+1=\nA: 2\nQ: 9-4=\nA:", Problem(9, "-", 4)),  # the last question counts
        ([{"role": "user", "content": "Q: 2+3=\nA:"}], Problem(2, "+", 3)),
        (
            [
                {"role": "system", "content": "Q: 9+9="},
                {"role": "user", "content": "Q: 1+1="},
                {"role": "assistant", "content": " 2"},
                {"role": "user", "content": "Q: 4-1=\nA:"},
            ],
            Problem(4, "-", 1),
        ),
        ("What is 7+5?", None),
        ("", None),
        (None, None),
        ([{"role": "assistant", "content": "Q: 2+3="}], None),
    ],
)
def test_parse_prompt(prompt, expected):
    assert parse_prompt(prompt) == expected


# ---------------------------------------------------------------- rewards


@pytest.mark.parametrize(
    "completion, answer, well_formed",
    [
        (" 12", 12, 1.0),
        ("12", 12, 1.0),
        (" 12\n", 12, 1.0),
        (" 13", 13, 1.0),  # well-formed, if wrong
        (" -3", -3, 1.0),
        (" 012", 12, 1.0),
        (" 12 13", None, 0.5),
        (" 12.", None, 0.5),
        (" 12\nQ: 3+4=\nA: 7", None, 0.5),
        (" 12 apples", None, 0.5),
        (" twelve", None, 0.0),
        (" A: 12", None, 0.0),
        (" -", None, 0.0),
        ("", None, 0.0),
        ("   ", None, 0.0),
        (None, None, 0.0),
        ([{"role": "assistant", "content": "12"}], 12, 1.0),
    ],
)
def test_parse_answer_and_format_reward(completion, answer, well_formed):
    assert parse_answer(completion) == answer
    assert format_reward([PROMPT], [completion]) == [well_formed]


def test_exact_answer_hand_made_completions():
    completions = [" 12", "12", " 12\n", " 13", " 11", " 12 13", " 12\nQ: 3+4=\nA: 7", " twelve", "", None, " -12"]
    expected = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    prompts = [PROMPT] * len(completions)
    assert exact_answer(prompts, completions, answer=["12"] * len(completions)) == expected
    assert exact_answer(prompts, completions, answer=[12] * len(completions)) == expected  # ints too
    assert exact_answer(prompts, completions) == expected  # no column: solved from the prompt


def test_reward_kwargs_plumbing_follows_the_rows():
    # As an RL trainer calls it: G completions per prompt, every extra column of the prompt rows
    # repeated alongside, plus keywords of its own.
    rows = [{"prompt": "Q: 7+5=\nA:", "answer": "12"}, {"prompt": "Q: 9-4=\nA:", "answer": "5"}]
    group = 3
    prompts = [r["prompt"] for r in rows for _ in range(group)]
    columns = {"answer": [r["answer"] for r in rows for _ in range(group)]}
    completions = [" 12", " 5", " 12 ", " 5", " 12", "5\n"]
    extra = {"completion_ids": [[1, 2]] * len(prompts), "trainer_state": object(), "split": ["train"] * len(prompts)}
    assert exact_answer(prompts, completions, **columns, **extra) == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert format_reward(prompts, completions, **columns, **extra) == [1.0] * 6
    for fn in get_task("arithmetic").reward_functions.values():
        assert len(fn(prompts, completions, **columns, **extra)) == len(prompts)


def test_exact_answer_not_applicable_rows_are_none():
    prompts = [PROMPT, "no question here", PROMPT]
    assert exact_answer(prompts, [" 12", " 3", " 1"]) == [1.0, None, 0.0]
    assert exact_answer(prompts, [" 12", " 3", " 1"], answer=["12", "3", None]) == [1.0, 1.0, None]


def test_exact_answer_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"answer\[1\]: 'twelve' is not an integer"):
        exact_answer([PROMPT, PROMPT], [" 12", " 12"], answer=["12", "twelve"])
    with pytest.raises(ValueError, match="answer: 1 values for 2 prompts"):
        exact_answer([PROMPT, PROMPT], [" 12", " 12"], answer=["12"])
    with pytest.raises(ValueError, match="completions: 1 values for 2 prompts"):
        exact_answer([PROMPT, PROMPT], [" 12"])
    with pytest.raises(ValueError, match="completions"):
        format_reward([PROMPT], [" 12", " 12"])


def test_accuracy():
    prompts = [PROMPT, "Q: 9-4=\nA:", "Q: 0+0=\nA:", "Q: 3+3=\nA:"]
    completions = [" 12", " 4", " 0", " 6 6"]
    assert accuracy(prompts, completions, ["12", "5", "0", "6"]) == 0.5
    assert accuracy(prompts, completions) == 0.5
    assert accuracy(prompts, completions, ["12", "5", None, "6"]) == pytest.approx(1 / 3, abs=1e-12)
    with pytest.raises(ValueError, match="at least one"):
        accuracy([], [], [])


def test_judge_checks_the_answer_to_the_prompt_itself():
    assert judge(PROMPT, " 12") == 1.0
    assert judge(PROMPT, " 13") == 0.0
    assert judge(PROMPT, " 12 13") == 0.0
    assert judge(PROMPT, "") == 0.0
    assert judge("Q: 12-12=\nA:", " 0") == 1.0
    assert judge([{"role": "user", "content": "Q: 6+7=\nA:"}], [{"role": "assistant", "content": "13"}]) == 1.0
    with pytest.raises(ValueError, match="no 'Q: a\\+b=' or 'Q: a-b=' problem in prompt 'hello'"):
        judge("hello", " 12")
    for problem in all_problems():  # the judge and the answer column agree on every problem
        assert judge(problem.prompt, f" {problem.answer}") == 1.0
        assert judge(problem.prompt, f" {problem.answer + 1}") == 0.0


def test_registry():
    task = TASKS["arithmetic"]
    assert get_task("arithmetic") is task and get_judge("arithmetic") is judge
    assert task.score_range == (0.0, 1.0)
    assert task.write_data is write_task_data and task.corpus_text is corpus_text
    assert task.reward_functions == {"exact_answer": exact_answer, "format": format_reward}
    assert "support" in TASKS


# ---------------------------------------------------------------- data sets


def _slip_and_run_on(row: dict) -> tuple[bool, bool]:
    """Whether a demonstration's answer is off, and whether it runs on; checks its shape."""
    problem = parse_prompt(row["prompt"])
    match = RUN_ON.fullmatch(row["completion"])
    if match:
        first, a, op, b, second = match.groups()
        assert Problem(int(a), op, int(b)).answer == int(second)  # the run-on question is answered right
        answer = int(first)
    else:
        answer = parse_answer(row["completion"])
        assert answer is not None and row["completion"] == f" {answer}", row
    assert abs(answer - problem.answer) <= 1 and answer >= 0, row  # a slip is off by exactly one
    return answer != problem.answer, match is not None


def test_sft_rows_are_imperfect_demonstrations():
    rows = make_sft_rows(seed=0)
    train_prompts = {p.prompt for p in make_problems("train")}
    assert len(rows) == 2000 and all(set(r) == {"prompt", "completion"} for r in rows)
    assert {r["prompt"] for r in rows} == train_prompts  # whole passes cover every train problem
    flags = [_slip_and_run_on(r) for r in rows]
    slips = sum(s for s, _ in flags) / len(rows)
    run_ons = sum(r for _, r in flags) / len(rows)
    assert abs(slips - SLIP_RATE) < 0.05 and abs(run_ons - RUN_ON_RATE) < 0.05
    exact = accuracy([r["prompt"] for r in rows], [r["completion"] for r in rows])
    assert 0.35 < exact < 0.65  # clearly below 1: room for RL
    eval_rows = make_sft_rows(seed=0, n=100, split="eval")
    assert {r["prompt"] for r in eval_rows} <= {p.prompt for p in make_problems("eval")}
    clean = make_sft_rows(seed=0, n=300, slip_rate=0.0, run_on_rate=0.0)
    assert accuracy([r["prompt"] for r in clean], [r["completion"] for r in clean]) == 1.0


def test_rows_are_deterministic_per_seed():
    assert make_sft_rows(3, n=200) == make_sft_rows(3, n=200)
    assert make_sft_rows(3, n=200) != make_sft_rows(4, n=200)
    assert make_prompt_rows("eval") == make_prompt_rows("eval")


def test_prompt_rows_carry_right_answers():
    for split in ("train", "eval"):
        rows = make_prompt_rows(split)
        assert [r["prompt"] for r in rows] == [p.prompt for p in make_problems(split)]
        for row in rows:
            assert set(row) == {"prompt", "answer"} and isinstance(row["answer"], str)
            a, op, b = re.fullmatch(r"Q: (\d+)([+-])(\d+)=\nA:", row["prompt"]).groups()
            assert int(row["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))


def test_write_task_data(tmp_path):
    sizes = {"sft": 40, "sft_eval": 10, "prefs_train": 30, "prefs_eval": 20}
    files = write_task_data(tmp_path / "a", seed=0, sizes=sizes)
    assert set(files) == {"sft", "sft_eval", "prefs_train", "prefs_eval", "prompts_train", "prompts_eval", "corpus"}
    fields = {
        "sft": {"prompt", "completion"},
        "sft_eval": {"prompt", "completion"},
        "prefs_train": {"prompt", "chosen", "rejected"},
        "prefs_eval": {"prompt", "chosen", "rejected"},
        "prompts_train": {"prompt", "answer"},
        "prompts_eval": {"prompt", "answer"},
    }
    counts = {**sizes, "prompts_train": len(make_problems("train")), "prompts_eval": 52}
    for name, keys in fields.items():
        path = files[name]
        assert path.name == f"{name}.jsonl" and path.parent == tmp_path / "a"
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        assert len(rows) == counts[name], name
        assert all(set(row) == keys and all(isinstance(v, str) for v in row.values()) for row in rows), name
    eval_rows = [json.loads(line) for line in files["prompts_eval"].read_text().splitlines()]
    assert eval_rows == make_prompt_rows("eval")
    assert files["corpus"].read_text(encoding="utf-8") == corpus_text()

    again = write_task_data(tmp_path / "b", seed=0, sizes=sizes)
    other = write_task_data(tmp_path / "c", seed=1, sizes=sizes)
    assert all(files[k].read_bytes() == again[k].read_bytes() for k in files)
    assert files["sft"].read_bytes() != other["sft"].read_bytes()
    assert files["prompts_eval"].read_bytes() == other["prompts_eval"].read_bytes()  # the split is fixed
    with pytest.raises(ValueError, match="unknown size"):
        write_task_data(tmp_path, sizes={"prompts": 3})


def test_corpus_covers_every_prompt_and_completion():
    corpus = corpus_text()
    for problem in all_problems():
        assert f"{problem.prompt} {problem.answer}\n" in corpus
    rows = make_sft_rows(seed=0, n=500)
    assert {ch for r in rows for ch in r["prompt"] + r["completion"]} <= set(corpus)


def test_tokenizer_trained_on_the_corpus_keeps_each_answer_one_token():
    from rlhfkit.models.init_model import train_tokenizer

    tokenizer = train_tokenizer(corpus_text().splitlines(), vocab_size=1024)
    largest = max(p.answer for p in all_problems())
    for n in range(largest + 2):  # a slipped answer can be one above the largest
        assert len(tokenizer.tokenize(f" {n}")) == 1, n
    for row in make_sft_rows(seed=0, n=200):
        text = row["prompt"] + row["completion"]
        assert tokenizer.decode(tokenizer.encode(text)) == text
