"""The built-in customer-support task: prompts, the gold judge, and the data sets."""

from __future__ import annotations

import json
import random
import re

import pytest

from rlhfkit.tasks import TASKS, get_judge
from rlhfkit.tasks.support import (
    CATEGORIES,
    corpus_text,
    gold_breakdown,
    gold_reward,
    gold_score,
    ideal_reply,
    label_noise_ceiling,
    make_preference_rows,
    make_prompts,
    make_sft_rows,
    parse_prompt,
    write_task_data,
)
from rlhfkit.tasks.support.judge import SCORE_MAX, SCORE_MIN, vocabulary

REQUIRED = {"damaged item", "late delivery", "double charge", "password reset", "app crash", "refund", "cancellation"}

PROMPT = "Customer: My blender arrived damaged.\nAgent:"
EMPATHY = "I am so sorry about this."
ACK = "I see your blender arrived damaged."
ACTION = "I will send you a free replacement today."
CLOSING = "Thank you for your patience."
IDEAL = f" {EMPATHY} {ACK} {ACTION} {CLOSING}"
GENERIC = f" {EMPATHY} {ACK} Please contact us again later. {CLOSING}"
WRONG_ACTION = f" {EMPATHY} {ACK} I have reversed the extra charge on your card. {CLOSING}"
APOLOGY_X3 = f" {EMPATHY} {EMPATHY} {EMPATHY} {ACK} {ACTION} {CLOSING}"
OVER_LONG = (
    IDEAL + " Our team is always here to help. We really value your business."
    " Your satisfaction is our top priority. We work hard to make every order perfect."
)
PILED_ACTIONS = f" {EMPATHY} {ACK} {ACTION} {ACTION} {ACTION} {CLOSING}"


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


# ---------------------------------------------------------------- prompts


def test_prompts_are_many_distinct_and_split_cleanly():
    train, eval_ = make_prompts("train"), make_prompts("eval")
    train_texts = [r["prompt"] for r in train]
    eval_texts = [r["prompt"] for r in eval_]
    assert len(set(train_texts)) == len(train_texts)
    assert len(set(eval_texts)) == len(eval_texts)
    assert len(set(train_texts) | set(eval_texts)) >= 300
    assert not set(train_texts) & set(eval_texts)
    assert 0.1 < len(eval_) / (len(train) + len(eval_)) < 0.3
    assert len(CATEGORIES) >= 7 and REQUIRED <= set(CATEGORIES)
    assert {r["category"] for r in train} == set(CATEGORIES) == {r["category"] for r in eval_}
    assert make_prompts("train") == train  # fixed split


def test_prompt_format():
    for row in make_prompts("train") + make_prompts("eval"):
        assert set(row) == {"prompt", "category"}
        match = re.fullmatch(r"Customer: (.+)\nAgent:", row["prompt"])
        assert match, row["prompt"]
        assert len(match.group(1).split()) <= 20


def test_unknown_split_is_an_error():
    with pytest.raises(ValueError, match="split"):
        make_prompts("test")


def test_judge_recovers_category_of_every_prompt():
    for row in make_prompts("train") + make_prompts("eval"):
        category, _ = parse_prompt(row["prompt"])
        assert category == row["category"], row["prompt"]


def test_ideal_reply_gets_full_marks_on_every_prompt():
    # Full marks need the right category (action) and the right product (issue) from the prompt.
    rng = random.Random(0)
    for row in make_prompts("train") + make_prompts("eval"):
        _, product = parse_prompt(row["prompt"])
        reply = ideal_reply(rng, row["category"], product)
        assert gold_score(row["prompt"], " " + reply) == SCORE_MAX, (row["prompt"], reply)


# ---------------------------------------------------------------- gold judge


def test_hand_worked_scores():
    # empathy 1 + issue 1 + action 2 + closing 0.5 + concise 0.5
    assert gold_score(PROMPT, IDEAL) == pytest.approx(5.0, abs=1e-9)
    # generic action earns nothing for the action
    assert gold_score(PROMPT, GENERIC) == pytest.approx(3.0, abs=1e-9)
    # another category's action costs 1
    assert gold_score(PROMPT, WRONG_ACTION) == pytest.approx(2.0, abs=1e-9)
    # no product named: half the issue credit
    assert gold_score(PROMPT, IDEAL.replace("blender", "kettle")) == pytest.approx(4.5, abs=1e-9)


def test_apology_three_times_is_penalised_by_count_and_repetition():
    b = gold_breakdown(PROMPT, APOLOGY_X3)
    assert b.empathy == pytest.approx(-1.0)  # 1 - 2 extra
    n = len(_words(APOLOGY_X3))
    trigrams = [tuple(_words(APOLOGY_X3)[i : i + 3]) for i in range(n - 2)]
    expected_rep = -3.0 * (len(trigrams) - len(set(trigrams))) / len(trigrams)
    assert b.repetition == pytest.approx(expected_rep)
    assert b.repetition < 0


def test_ranking_of_reply_kinds():
    ideal = gold_score(PROMPT, IDEAL)
    worse = {
        "generic": gold_score(PROMPT, GENERIC),
        "wrong action": gold_score(PROMPT, WRONG_ACTION),
        "apology x3": gold_score(PROMPT, APOLOGY_X3),
        "over long": gold_score(PROMPT, OVER_LONG),
        "piled actions": gold_score(PROMPT, PILED_ACTIONS),
    }
    for name, score in worse.items():
        assert score < ideal, name
    assert worse["generic"] > worse["wrong action"]
    degenerate = [gold_score(PROMPT, r) for r in ("", "   ", " !!!", " xqz blorf wib zzkt plonk frap")]
    assert max(degenerate) < min(worse.values())
    assert all(s == SCORE_MIN for s in degenerate)


def test_judge_reads_the_category_from_the_prompt():
    # The same reply is right for a damaged item but wrong for a double charge.
    other = "Customer: I was charged twice for my blender.\nAgent:"
    assert gold_score(other, IDEAL) < gold_score(PROMPT, IDEAL) - 2


def test_judge_is_deterministic_and_bounded():
    rows = make_sft_rows(0, n=200)
    first = [gold_score(r["prompt"], r["completion"]) for r in rows]
    assert first == [gold_score(r["prompt"], r["completion"]) for r in rows]
    assert all(SCORE_MIN <= s <= SCORE_MAX for s in first)


def test_registry():
    assert get_judge("support") is gold_score
    assert TASKS["support"].judge is gold_score
    with pytest.raises(ValueError, match="support"):
        get_judge("chess")
    assert TASKS["support"].reward_functions == {"gold": gold_reward}


def test_gold_reward_is_the_judge_with_trl_signature():
    prompts = [PROMPT] * 4 + ["Customer: I was charged twice for my blender.\nAgent:"]
    completions = [IDEAL, GENERIC, WRONG_ACTION, None, IDEAL]
    expected = [gold_score(p, c or "") for p, c in zip(prompts, completions)]
    rewards = gold_reward(prompts, completions, completion_ids=[[1]] * 5, category=["x"] * 5)
    assert rewards == expected
    assert rewards[0] == SCORE_MAX and rewards[3] == SCORE_MIN  # None is an empty reply
    chat_prompt = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "My blender arrived damaged."},
    ]
    chat_completion = [{"role": "assistant", "content": IDEAL.strip()}]
    assert gold_reward([chat_prompt], [chat_completion]) == [SCORE_MAX]
    with pytest.raises(ValueError, match="2 completions for 1 prompts"):
        gold_reward([PROMPT], [IDEAL, IDEAL])


# ---------------------------------------------------------------- data sets


def test_sft_rows_are_mixed_quality_demonstrations():
    rows = make_sft_rows(seed=0)
    train_prompts = {r["prompt"] for r in make_prompts("train")}
    assert len(rows) == 2000
    for row in rows:
        assert set(row) == {"prompt", "completion"}
        assert row["prompt"] in train_prompts
        assert row["completion"].startswith(" ")
        assert 8 <= len(row["completion"].split()) <= 35
    scores = [gold_score(r["prompt"], r["completion"]) for r in rows]
    mean = sum(scores) / len(scores)
    assert 0.3 * SCORE_MAX < mean < 0.65 * SCORE_MAX  # clearly below the ideal: room for RLHF
    assert sum(s == SCORE_MAX for s in scores) / len(scores) < 0.2
    assert len({r["completion"] for r in rows}) > 500
    eval_rows = make_sft_rows(seed=0, n=50, split="eval")
    assert {r["prompt"] for r in eval_rows} <= {r["prompt"] for r in make_prompts("eval")}


def test_rows_are_deterministic_per_seed():
    assert make_sft_rows(3, n=100) == make_sft_rows(3, n=100)
    assert make_sft_rows(3, n=100) != make_sft_rows(4, n=100)
    assert make_preference_rows("eval", 3, n=100) == make_preference_rows("eval", 3, n=100)
    assert make_preference_rows("eval", 3, n=100) != make_preference_rows("eval", 4, n=100)


def test_preference_labels_are_noisy_but_informative():
    rows = make_preference_rows("train", seed=0, n=800)
    assert all(set(r) == {"prompt", "chosen", "rejected"} for r in rows)
    assert all(r["chosen"] != r["rejected"] for r in rows)
    agree = 0.0
    for r in rows:
        c, j = gold_score(r["prompt"], r["chosen"]), gold_score(r["prompt"], r["rejected"])
        agree += 1.0 if c > j else 0.5 if c == j else 0.0
    rate = agree / len(rows)
    assert 0.65 < rate < 0.95
    assert label_noise_ceiling(rows) == pytest.approx(rate, abs=1e-12)
    eval_rows = make_preference_rows("eval", seed=0, n=100)
    assert {r["prompt"] for r in eval_rows} <= {r["prompt"] for r in make_prompts("eval")}


def test_preference_replies_never_repeat_apologies_or_actions():
    # The reward model's blind spot is natural: the data has no such replies.
    rows = make_preference_rows("train", seed=0)
    for r in rows:
        for reply in (r["chosen"], r["rejected"]):
            b = gold_breakdown(r["prompt"], reply)
            assert b.empathy >= 0 and b.repetition == 0, reply
            assert b.action <= 2.0 and b.action in (2.0, 0.0, -1.0), reply


def test_corpus_covers_the_task_vocabulary():
    corpus_words = set(_words(corpus_text()))
    assert vocabulary() <= corpus_words
    assert {"customer", "agent"} <= corpus_words


def test_write_task_data(tmp_path):
    sizes = {"sft": 30, "sft_eval": 10, "prefs_train": 20, "prefs_eval": 10, "prompts_eval": 16}
    files = write_task_data(tmp_path, seed=0, sizes=sizes)
    assert set(files) == {"sft", "sft_eval", "prefs_train", "prefs_eval", "prompts_train", "prompts_eval", "corpus"}
    fields = {
        "sft": {"prompt", "completion"},
        "sft_eval": {"prompt", "completion"},
        "prefs_train": {"prompt", "chosen", "rejected"},
        "prefs_eval": {"prompt", "chosen", "rejected"},
        "prompts_train": {"prompt"},
        "prompts_eval": {"prompt"},
    }
    expected_rows = {**sizes, "prompts_train": len(make_prompts("train"))}
    for name, keys in fields.items():
        path = files[name]
        assert path.name == f"{name}.jsonl" and path.parent == tmp_path
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        assert len(rows) == expected_rows[name], name
        assert all(set(row) == keys and all(isinstance(v, str) for v in row.values()) for row in rows), name
    eval_prompts = [json.loads(line)["prompt"] for line in files["prompts_eval"].read_text().splitlines()]
    assert {parse_prompt(p)[0] for p in eval_prompts} == set(CATEGORIES)  # balanced subset
    assert files["corpus"].read_text(encoding="utf-8") == corpus_text()
    with pytest.raises(ValueError, match="unknown size"):
        write_task_data(tmp_path, sizes={"sft_rows": 3})


def test_product_naming_by_hand():
    from rlhfkit.tasks.support import product_naming, product_naming_shares

    assert product_naming(PROMPT, IDEAL) == (True, True)
    assert product_naming(PROMPT, " I see your lamp arrived damaged.") == (True, False)  # the wrong product
    assert product_naming(PROMPT, " Sorry, the blender and the lamp.") == (True, False)  # another one besides
    assert product_naming(PROMPT, GENERIC.replace("blender", "order")) == (False, False)
    assert product_naming("Customer: The app keeps crashing on my phone.\nAgent:", " Sorry.") is None
    prompts = [PROMPT] * 4 + ["Customer: The app keeps crashing on my phone.\nAgent:"]
    replies = [IDEAL, IDEAL, " Your lamp is damaged.", " Sorry for the trouble.", " The lamp."]
    shares = product_naming_shares(prompts, replies)
    # 4 replies to a prompt with a product: 3 name one, 2 of those the right one; the app prompt is left out
    assert shares == {"names_product": pytest.approx(2 / 3, abs=1e-12), "mentions_product": 0.75}


def test_simulated_raters_label_policy_pairs_like_the_offline_pairs():
    """The raters as a pairwise judge follow the rule that labelled the offline pairs: P(a) = sigmoid(Δgold / T),
    seeded, and usable as `rlhfkit iterate --judge support`."""
    import math

    from rlhfkit.iterated.judges import load_judge
    from rlhfkit.tasks.support import RATER_TEMPERATURE, SimulatedRaters, gold_score, make_preference_rows

    rows = make_preference_rows("train", seed=3, n=600)
    prompts = [r["prompt"] for r in rows]
    pairs = [[r["chosen"], r["rejected"]] for r in rows]
    answers = SimulatedRaters(seed=0)(prompts, pairs)
    assert answers == SimulatedRaters(seed=0)(prompts, pairs) != SimulatedRaters(seed=1)(prompts, pairs)
    assert set(answers) <= {0, 1}
    # the share answering "a" matches the rule's expected share within sampling noise
    expected = [
        1 / (1 + math.exp(-(gold_score(p, a) - gold_score(p, b)) / RATER_TEMPERATURE))
        for p, (a, b) in zip(prompts, pairs)
    ]
    share, mean = answers.count(0) / len(answers), sum(expected) / len(expected)
    assert abs(share - mean) < 3 * math.sqrt(mean * (1 - mean) / len(answers)) + 1e-9
    # a clearly better reply wins far more often than not, in either position
    a_first = SimulatedRaters(seed=2)(prompts, pairs)
    b_first = SimulatedRaters(seed=2)(prompts, [[b, a] for a, b in pairs])
    clear = [i for i, e in enumerate(expected) if e > 0.9]
    assert len(clear) > 50
    assert sum(a_first[i] == 0 for i in clear) / len(clear) > 0.85
    assert sum(b_first[i] == 1 for i in clear) / len(clear) > 0.85
    judge = load_judge("support", seed=0)
    assert judge(prompts[:20], pairs[:20]) == SimulatedRaters(seed=0)(prompts[:20], pairs[:20])
