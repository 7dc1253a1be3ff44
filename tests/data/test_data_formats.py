"""File formats, the implicit-prompt preference form, and which tokens SFT learns from."""

from __future__ import annotations

import json

import pytest

from rlhfkit.data.collate import collate_sft
from rlhfkit.data.encode import IGNORE_INDEX, encode_sft
from rlhfkit.data.schema import PreferenceExample, SFTExample, load_examples
from rlhfkit.errors import UserError
from rlhfkit.models.loading import load_tokenizer

from ..helpers import sft_rows, write_jsonl

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_format(path_base, rows, fmt):
    if fmt in ("parquet", "datasets", "datasets-dict"):  # columnar: a field absent from a row is stored as null
        keys = list(dict.fromkeys(k for r in rows for k in r))
        rows = [{k: r.get(k) for k in keys} for r in rows]
    if fmt == "jsonl":
        return write_jsonl(path_base.with_suffix(".jsonl"), rows)
    if fmt == "json-list":
        path = path_base.with_suffix(".json")
        path.write_text(json.dumps(rows, indent=2), encoding="utf-8")
        return path
    if fmt == "json-data":
        path = path_base.with_suffix(".json")
        path.write_text(json.dumps({"data": rows}), encoding="utf-8")
        return path
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = path_base.with_suffix(".parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)
        return path
    if fmt == "datasets":
        import datasets

        path = path_base.parent / (path_base.name + "_ds")
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
        return path
    if fmt == "datasets-dict":
        import datasets

        path = path_base.parent / (path_base.name + "_dsd")
        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(path))
        return path
    raise ValueError(fmt)


FORMATS = ["jsonl", "json-list", "json-data", "parquet", "datasets", "datasets-dict"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_loads_the_same_sft_examples(tmp_path, fmt):
    rows = sft_rows(5, seed=3) + [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    ]
    # mixed columns: formats with a fixed schema fill absent fields with null, which must read as absent
    path = write_format(tmp_path / "data", rows, fmt)
    got = load_examples(str(path), "sft", "rlhfkit sft")
    assert got[:5] == [SFTExample(prompt=r["prompt"], completion=r["completion"]) for r in rows[:5]]
    assert got[5] == SFTExample(messages=rows[5]["messages"])


@pytest.mark.parametrize("fmt", ["parquet", "datasets"])
def test_non_jsonl_errors_name_the_row(tmp_path, fmt):
    rows = sft_rows(3, seed=4)
    rows[1]["completion"] = ""
    path = write_format(tmp_path / "data", rows, fmt)
    with pytest.raises(UserError, match=r"row 2: field 'completion': empty string"):
        load_examples(str(path), "sft", "rlhfkit sft")


def test_preferences_with_explicit_prompt_and_margin(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Q?", "chosen": " yes", "rejected": " no", "margin": 2}])
    assert load_examples(str(path), "preference", "rlhfkit rm") == [PreferenceExample("Q?", " yes", " no", 2.0)]


def test_implicit_prompt_strings_split_at_the_last_shared_assistant_turn(tmp_path):
    history = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: give alice the apple\n\nAssistant:"
    rows = [{"chosen": history + " Sure, here it is.", "rejected": history + " Sure, no."}]
    (ex,) = load_examples(str(write_jsonl(tmp_path / "hh.jsonl", rows)), "preference", "rlhfkit rm")
    assert ex.prompt == history
    assert (ex.chosen, ex.rejected) == (" Sure, here it is.", " Sure, no.")


def test_implicit_prompt_message_lists_split_before_the_final_assistant_turn(tmp_path):
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "give alice the apple"},
    ]
    rows = [
        {
            "chosen": turns + [{"role": "assistant", "content": "here"}],
            "rejected": turns + [{"role": "assistant", "content": "no"}],
        }
    ]
    (ex,) = load_examples(str(write_jsonl(tmp_path / "hh.jsonl", rows)), "preference", "rlhfkit rm")
    assert ex.prompt == turns
    assert ex.chosen == [{"role": "assistant", "content": "here"}]
    assert ex.rejected == [{"role": "assistant", "content": "no"}]


def test_implicit_prompt_without_a_shared_turn_is_an_error(tmp_path):
    rows = [{"chosen": "Human: a\n\nAssistant: b", "rejected": "Human: c\n\nAssistant: d"}]
    with pytest.raises(UserError, match=r"line 1: field 'chosen'"):
        load_examples(str(write_jsonl(tmp_path / "hh.jsonl", rows)), "preference", "rlhfkit rm")


def _trained_text(tokenizer, ids, labels) -> str:
    return tokenizer.decode([i for i, lab in zip(ids, labels) if lab != IGNORE_INDEX])


def test_prompt_completion_trains_on_completion_and_eos_only(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    ex = SFTExample(prompt="Question: what does bob want? Answer:", completion=" bob wants the hat today.")
    ids, labels = encode_sft(tok, ex, max_length=256, max_prompt_length=128)
    assert tok.decode(ids) == ex.prompt + ex.completion + tok.eos_token
    assert _trained_text(tok, ids, labels) == ex.completion + tok.eos_token
    assert ids[-1] == tok.eos_token_id and labels[-1] == tok.eos_token_id
    n_prompt = len(tok(ex.prompt)["input_ids"])
    assert all(lab == IGNORE_INDEX for lab in labels[:n_prompt]) and all(
        lab != IGNORE_INDEX for lab in labels[n_prompt:]
    )


CONVERSATION = [
    {"role": "system", "content": "you are a helpful assistant."},
    {"role": "user", "content": "please give alice the apple"},
    {"role": "assistant", "content": "Sure, here is the apple for alice."},
    {"role": "user", "content": "please give bob the hat"},
    {"role": "assistant", "content": "Sure, here is the hat for bob."},
]


def test_messages_with_the_plain_template_mask_all_but_assistant_tokens(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    assert not tok.chat_template
    ids, labels = encode_sft(tok, SFTExample(messages=CONVERSATION), max_length=256, max_prompt_length=128)
    eos = tok.eos_token
    assert tok.decode(ids) == (
        "System: you are a helpful assistant.\nUser: please give alice the apple\n"
        f"Assistant: Sure, here is the apple for alice.{eos}\nUser: please give bob the hat\n"
        f"Assistant: Sure, here is the hat for bob.{eos}\n"
    )
    assert (
        _trained_text(tok, ids, labels)
        == f" Sure, here is the apple for alice.{eos} Sure, here is the hat for bob.{eos}"
    )


def test_messages_with_a_chat_template_mask_all_but_assistant_tokens(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    tok.chat_template = CHAT_TEMPLATE
    ids, labels = encode_sft(tok, SFTExample(messages=CONVERSATION), max_length=256, max_prompt_length=128)
    eos = tok.eos_token
    assert tok.decode(ids) == tok.apply_chat_template(CONVERSATION, tokenize=False)
    assert (
        _trained_text(tok, ids, labels) == f"Sure, here is the apple for alice.{eos}Sure, here is the hat for bob.{eos}"
    )
    # the template's own markers around user turns are never trained on
    first_user = tok.decode(ids).index("<|user|>")
    assert all(lab == IGNORE_INDEX for lab in labels[: len(tok(tok.decode(ids)[: first_user + 20])["input_ids"])])


def test_chat_template_is_used_for_conversational_prompt_completion(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    tok.chat_template = CHAT_TEMPLATE
    ex = SFTExample(prompt=[{"role": "user", "content": "hi"}], completion=[{"role": "assistant", "content": "hello"}])
    ids, labels = encode_sft(tok, ex, max_length=256, max_prompt_length=128)
    assert tok.decode(ids) == "<|user|>hi<|endoftext|><|assistant|>hello<|endoftext|>"
    assert _trained_text(tok, ids, labels) == "hello<|endoftext|>"


def test_collate_sft_right_pads_and_ignores_padding(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    items = [encode_sft(tok, SFTExample(prompt="Q:", completion=c), 256, 128) for c in (" a", " alice wants the apple")]
    batch = collate_sft(items, tok.pad_token_id)
    short = len(items[0][0])
    assert batch["input_ids"].shape == (2, len(items[1][0]))
    assert batch["attention_mask"][0].tolist() == [1] * short + [0] * (batch["input_ids"].shape[1] - short)
    assert (batch["labels"][0, short:] == IGNORE_INDEX).all()
    assert (batch["input_ids"][0, short:] == tok.pad_token_id).all()


def test_truncation_keeps_prompt_end_and_cuts_response_end(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    ex = SFTExample(
        prompt="Question: what does alice want please please please? Answer:",
        completion=" alice wants the apple today.",
    )
    ids, labels = encode_sft(tok, ex, max_length=12, max_prompt_length=6)
    prompt_ids = tok(ex.prompt)["input_ids"]
    assert len(ids) == 12
    assert ids[:6] == prompt_ids[-6:]
    assert sum(lab != IGNORE_INDEX for lab in labels) == 6


def test_a_prompt_longer_than_max_length_loses_its_start_and_keeps_one_response_token(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    ex = SFTExample(
        prompt="Question: what does alice want please please please? Answer:", completion=" alice wants it."
    )
    prompt_ids = tok(ex.prompt)["input_ids"]
    assert len(prompt_ids) > 8
    ids, labels = encode_sft(tok, ex, max_length=8, max_prompt_length=128)
    assert len(ids) == 8 and ids[:7] == prompt_ids[-7:]
    assert [lab != IGNORE_INDEX for lab in labels] == [False] * 7 + [True]
