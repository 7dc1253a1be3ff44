"""`rlhfkit revise`: the model answers, critiques its answer by a principle drawn per prompt, and rewrites it; the
revisions are rows `rlhfkit sft` trains on, the (revision, answer) pairs rows `rlhfkit rm` / `dpo` read."""

from __future__ import annotations

import pytest

import rlhfkit
from rlhfkit.data.schema import load_examples
from rlhfkit.judging import revise as revise_module
from rlhfkit.models.loading import load_tokenizer
from tests.helpers import read_jsonl, write_jsonl

PRINCIPLES = ["Be kind to alice.", "Name the item."]
PROMPTS = [
    {"prompt": "Question: what does alice want? Answer:"},
    {"prompt": [{"role": "user", "content": "please give bob the hat"}]},
    {"prompt": "Question: what does carol want? Answer:", "id": 3},
]


@pytest.fixture(scope="module")
def revised(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("revise")
    write_jsonl(d / "prompts.jsonl", PROMPTS)
    (d / "principles.txt").write_text("# the constitution\n" + "\n".join(PRINCIPLES) + "\n\n")
    seen = []
    sample = revise_module.sample_responses

    def recording(model, tokenizer, prompts_ids, *args, **kwargs):
        seen.append([tokenizer.decode(ids) for ids in prompts_ids])
        return sample(model, tokenizer, prompts_ids, *args, **kwargs)

    revise_module.sample_responses = recording
    try:
        result = rlhfkit.revise(
            model=str(tiny_model_dir), data=str(d / "prompts.jsonl"), output_dir=str(d / "out"),
            principles=str(d / "principles.txt"), max_new_tokens=8, progress=False,
        )  # fmt: skip
    finally:
        revise_module.sample_responses = sample
    return d, result, seen


def test_each_prompt_is_answered_critiqued_by_its_principle_and_revised(revised):
    d, result, seen = revised
    steps = read_jsonl(d / "out" / "revisions.jsonl")
    assert [s["prompt"] for s in steps] == [p["prompt"] for p in PROMPTS]
    assert all(s["principle"] in PRINCIPLES for s in steps)
    answers, critiques, revisions = seen  # three sampling passes, one per step
    for s, critique_prompt, revision_prompt in zip(steps, critiques, revisions):
        assert s["principle"] in critique_prompt and s["answer"].strip() in critique_prompt
        # the revision request follows the critique request and the critique (its start may be cut to fit)
        assert f"Critique your last reply by this principle: {s['principle']}" in revision_prompt
        assert s["critique"].strip() in revision_prompt and "Rewrite your reply" in revision_prompt
    assert result.metrics["prompts"] == 3 and result.metrics["principles"] == PRINCIPLES


def test_the_revisions_are_rows_sft_trains_on_and_the_pairs_rows_rm_reads(revised, tiny_model_dir):
    d, result, _ = revised
    sft_rows = read_jsonl(d / "out" / "sft.jsonl")
    steps = {str(s["prompt"]): s for s in read_jsonl(d / "out" / "revisions.jsonl")}
    assert len(sft_rows) == result.metrics["revisions"] > 0
    for row in sft_rows:
        revision = steps[str(row["prompt"])]["revision"].strip()
        if isinstance(row["prompt"], str):
            assert row["completion"] == " " + revision
        else:
            assert row["completion"] == [{"role": "assistant", "content": revision}]
    assert len(load_examples(str(d / "out" / "sft.jsonl"), "sft", "rlhfkit sft")) == len(sft_rows)
    pairs = read_jsonl(d / "out" / "pairs.jsonl")
    assert len(load_examples(str(d / "out" / "pairs.jsonl"), "preference", "rlhfkit rm")) == len(pairs)
    for p in pairs:
        s = steps[str(p["prompt"])]
        assert p["chosen"] != p["rejected"] and s["revision"].strip() in str(p["chosen"])
    trained = rlhfkit.sft(
        model=str(tiny_model_dir), data=str(d / "out" / "sft.jsonl"), output_dir=str(d / "sft"), max_steps=2,
        progress=False,
    )  # fmt: skip
    assert (trained.output_dir / "model.safetensors").is_file() and trained.metrics["loss"] > 0


def test_the_principles_drawn_follow_the_seed(revised, tiny_model_dir, tmp_path):
    d, _, _ = revised
    again = rlhfkit.revise(
        model=str(tiny_model_dir), data=str(d / "prompts.jsonl"), output_dir=str(tmp_path / "again"),
        principles=str(d / "principles.txt"), max_new_tokens=8, progress=False,
    )  # fmt: skip
    first, second = (read_jsonl(p / "revisions.jsonl") for p in (d / "out", again.output_dir))
    assert first == second  # the same seed: the same principles and the same samples
    assert load_tokenizer(str(tiny_model_dir)).chat_template is None  # so the plain template was used above
