"""The notes task: its gold judge on hand-scored replies, its data files, and the simulated raters (of this task
and of the arithmetic task) labelling with the noise their temperature sets."""

from __future__ import annotations

import json
import math
import random

import pytest

from rlhfkit.tasks import arithmetic, get_task, notes, rater_tasks
from rlhfkit.tasks.raters import GoldRaters, prefers_first


@pytest.mark.parametrize(
    "prompt, reply, score",
    [
        # 10 words (+1), names the invoice (+1), right greeting (+0.5), sign-off (+0.5)
        ("Note to Ada about the invoice:", " Hi Ada, the invoice is ready. see you soon. Best, Sam", 3.0),
        # private: naming the keys costs 1.5; 4 words: 4 under the band, -1
        ("Note to Ben about the keys (private):", " the keys are here.", -2.5),
        # private and not named: +0.5; 8 words: +1; another name: -0.5
        ("Note to Ben about the keys (private):", " Hi Cleo, thanks for the help. it went well.", 1.0),
        # 24 words: 8 over the band, -2 (the most it costs); named +1
        ("Note to Dev about the trip:", " " + " ".join(["the trip is ready."] * 6), -1.0),
    ],
)
def test_gold_score_on_hand_scored_replies(prompt, reply, score):
    assert notes.gold_score(prompt, reply) == pytest.approx(score)


def test_a_prompt_that_asks_no_note_is_an_error():
    with pytest.raises(ValueError, match="no 'Note to NAME"):
        notes.gold_score("Q: 1+2=\nA:", " 3")


def test_notes_data_files(tmp_path):
    files = get_task("notes").write_data(tmp_path, seed=0, sizes={"sft": 30, "prefs_train": 40})
    rows = {n: [json.loads(x) for x in files[n].read_text().splitlines()] for n in files if n != "corpus"}
    assert len(rows["sft"]) == 30 and len(rows["prefs_train"]) == 40
    assert all(r["chosen"] != r["rejected"] for r in rows["prefs_train"])
    eval_prompts = {r["prompt"].replace(" (private)", "") for r in rows["prompts_eval"]}
    train_prompts = {r["prompt"].replace(" (private)", "") for r in rows["sft"] + rows["prompts_train"]}
    assert not eval_prompts & train_prompts  # held-out (name, thing) combinations
    words = set(files["corpus"].read_text().split())
    assert {w for r in rows["sft"] for w in r["completion"].split()} <= words | {w.capitalize() for w in words}
    sft_gold = [notes.gold_score(r["prompt"], r["completion"]) for r in rows["sft"]]
    assert max(sft_gold) - min(sft_gold) > 2  # demonstrations of mixed quality leave room to improve


def test_raters_prefer_the_higher_gold_as_often_as_their_temperature_says():
    rng = random.Random(0)
    judge = lambda prompt, reply: float(len(reply))  # noqa: E731
    wins = sum(prefers_first(rng, judge, "", "aa", "a", 0.5) for _ in range(4000)) / 4000
    assert wins == pytest.approx(1 / (1 + math.exp(-1 / 0.5)), abs=0.02)  # sigmoid(2) = 0.881
    raters = GoldRaters("x", judge, 0.5, seed=1)
    assert raters(["p"] * 3, [["aa", "a"]] * 3) == GoldRaters("x", judge, 0.5, seed=1)(["p"] * 3, [["aa", "a"]] * 3)


@pytest.mark.parametrize("module", [arithmetic, notes])
def test_offline_pairs_agree_with_the_gold_as_the_raters_do(module):
    assert {"arithmetic", "notes", "support"} <= set(rater_tasks())
    rows = module.make_preference_rows("train", 0, 400)
    judge = get_task(module.__name__.rsplit(".", 1)[1]).judge
    differ = [r for r in rows if judge(r["prompt"], r["chosen"]) != judge(r["prompt"], r["rejected"])]
    agree = sum(judge(r["prompt"], r["chosen"]) > judge(r["prompt"], r["rejected"]) for r in differ) / len(differ)
    assert 0.7 < agree < 0.97, agree  # noisy, but far above a coin
