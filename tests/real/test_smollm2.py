"""What toy models cannot show, on a real chat model: the GGUF path, the chat template and its end-of-turn
token, grouped-query attention + RoPE in the KV-cache and the packed paths with left padding, and LoRA on a
model whose LM head is tied to its embeddings."""

from __future__ import annotations

import json

import pytest
import torch

from rlhfkit.accel import decode as lean
from rlhfkit.accel import switched
from rlhfkit.accel.packing import pack_batch
from rlhfkit.config.parts import GenerationArgs
from rlhfkit.data.collate import pad_with_mask
from rlhfkit.data.encode import encode_prompt
from rlhfkit.models.forward import response_logprobs
from rlhfkit.models.sampling import sample_responses, stop_token_ids

from ..helpers import metrics, read_jsonl, run_cli, write_jsonl

QUESTIONS = ["What is the capital of France?", "Name a colour.", "Write one word that rhymes with cat."]


def chat_prompt_ids(tok, question: str) -> list[int]:
    return encode_prompt(tok, [{"role": "user", "content": question}], 256)


def test_gguf_file_loads_as_its_plain_folder_with_chat_template_and_end_of_turn(smollm2_gguf, smollm2_dir, smollm2):
    from transformers import AutoModelForCausalLM

    from rlhfkit.models.loading import load_causal_lm, load_tokenizer

    tok, model = smollm2
    assert tok.eos_token == "<|im_end|>" and tok.chat_template and "<|im_start|>" in tok.chat_template
    assert stop_token_ids(model, tok) == [tok.convert_tokens_to_ids("<|im_end|>")]
    from_file = load_causal_lm(str(smollm2_gguf), tokenizer=load_tokenizer(str(smollm2_gguf)))
    plain = AutoModelForCausalLM.from_pretrained(smollm2_dir)  # no rlhfkit needed to read the folder
    assert plain.config.model_type == "llama" and plain.config.num_key_value_heads < plain.config.num_attention_heads
    assert plain.lm_head.weight.data_ptr() == plain.model.embed_tokens.weight.data_ptr()  # tied
    for name, weight in plain.state_dict().items():
        torch.testing.assert_close(from_file.state_dict()[name], weight, rtol=0, atol=0)
    assert 130e6 < sum(p.numel() for p in plain.parameters()) < 140e6


def test_sampler_greedy_gives_generates_tokens_with_left_padding(smollm2):
    """The lean KV-cache decode step (grouped-query heads attending to their shared keys, RoPE at mask-counted
    positions) against transformers' own greedy generate, on a left-padded batch of chat prompts of different
    lengths."""
    tok, model = smollm2
    assert lean._supported(model)
    prompts = [chat_prompt_ids(tok, q) for q in QUESTIONS]
    assert len({len(p) for p in prompts}) > 1
    torch.manual_seed(0)
    ours = sample_responses(model, tok, prompts, GenerationArgs(max_new_tokens=12, top_k=1), len(prompts), "cpu")
    ids, mask = pad_with_mask(prompts, tok.pad_token_id, "left")
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id
        )
    eos = tok.eos_token_id
    for row, theirs in zip(ours, out[:, ids.shape[1] :].tolist()):
        theirs = theirs[: theirs.index(eos) + 1] if eos in theirs else theirs
        assert row == theirs
    assert "Paris" in tok.decode(ours[0])


def test_packed_log_probs_equal_padded_on_the_real_model(smollm2):
    """Two chat prompts, two responses each: packed (the prompt laid out once per group) = padded (9 query heads on
    3 key / value heads read in place, RoPE, the shared chat opening)."""
    tok, model = smollm2
    prompts = [chat_prompt_ids(tok, q) for q in QUESTIONS[:2]]
    replies = [["Paris.", "It is Paris, of course."], ["Blue", "Green is a colour."]]
    rows = [
        (p, tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
        for p, rs in zip(prompts, replies)
        for r in rs
    ]
    prompt_ids, prompt_mask = pad_with_mask([p for p, _ in rows], tok.pad_token_id, "left")
    response_ids, response_mask = pad_with_mask([r for _, r in rows], tok.pad_token_id, "right")
    input_ids = torch.cat([prompt_ids, response_ids], 1)
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    n = response_ids.shape[1]
    with switched("auto", options={"pack_sequences": False}):
        padded = response_logprobs(model, input_ids, attention_mask, n)
    packed_batch = pack_batch(model, input_ids, attention_mask, tok.pad_token_id, prompt_ids.shape[1])
    assert packed_batch is not None and len(packed_batch.input_ids) < len(rows)
    with switched("auto", options={"pack_sequences": True}):  # as a command runs the passes: packed
        packed = response_logprobs(model, input_ids, attention_mask, n)
    real = response_mask.bool()
    torch.testing.assert_close(packed[real], padded[real], rtol=0, atol=2e-4)


def test_lora_sft_on_chat_rows_from_the_gguf_file(smollm2_gguf, tmp_path, capsys):
    """`rlhfkit sft --model FILE.gguf --lora-r 8` on chat rows: the loss falls, and the output is a plain
    safetensors folder whose LM head is still tied to the embeddings and which ends replies with <|im_end|>."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "Banana banana banana."}]}
        for q in QUESTIONS
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", rows * 2)
    out = tmp_path / "sft"
    args = ["sft", "--model", smollm2_gguf, "--data", data, "--output-dir", out, "--lora-r", 8, "--max-steps", 6]
    args += ["--batch-size", 3, "--learning-rate", 3e-3, "--progress", "false", "--max-length", 128]
    code, printed, err = run_cli(capsys, *args)
    assert code == 0, err
    losses = [r["loss"] for r in metrics(out)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert err.strip().splitlines()[-1] == f"model saved to {out.resolve()}"  # the command line's messages
    assert not list(out.glob("*.gguf")) and (out / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert (
        model.config.tie_word_embeddings
        and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    )
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": [{"role": "user", "content": QUESTIONS[0]}]}])
    code, _, err = run_cli(
        capsys,
        "generate",
        "--model",
        out,
        "--data",
        prompts,
        "--output",
        tmp_path / "g.jsonl",
        "--max-new-tokens",
        12,
        "--top-k",
        1,
    )
    assert code == 0, err
    reply = read_jsonl(tmp_path / "g.jsonl")[0]["response"]
    assert "Banana" in reply, reply
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] in (
        tok.eos_token_id,
        [tok.eos_token_id],
    )


def test_the_demo_sizes_its_stages_for_the_real_model_and_speaks_its_chat_template(smollm2_gguf, tmp_path):
    from rlhfkit.demo.plan import LORA_ABOVE, chat_rows, plan
    from rlhfkit.tasks.support import write_task_data
    from rlhfkit.tasks.support.judge import gold_score

    run = plan(quick=False, model=str(smollm2_gguf))
    assert run.parameters > LORA_ABOVE and not run.value_model  # leave-one-out advantages: no value model
    assert run.settings["ppo"]["advantage"] == run.settings["iterate"]["advantage"]  # as iterated PPO's
    # every stage trains rank-16 adapters (the reward model's new score head in full) and saves them alone
    stages = ("sft", "rm", "ppo", "dpo", "iterate", "online_dpo")
    assert all(run.settings[s]["lora_r"] == 16 and run.settings[s]["save_merged"] is False for s in stages)
    assert run.settings["iterate"]["rm_lora_r"] == 16
    files = write_task_data(tmp_path / "data", sizes={"sft": 4, "prefs_train": 4, "prefs_eval": 2})
    chat = chat_rows(files, str(smollm2_gguf), tmp_path / "chat")
    plain_row = json.loads(files["sft"].read_text().splitlines()[0])
    chat_row = json.loads(chat["sft"].read_text().splitlines()[0])
    assert chat_row["prompt"][0]["role"] == "user" and "Agent:" not in chat_row["prompt"][0]["content"]
    assert chat_row["completion"] == [{"role": "assistant", "content": plain_row["completion"].strip()}]
    # the gold judge scores a reply to the chat prompt as it scores it to the plain one
    reply = chat_row["completion"][0]["content"]
    assert gold_score(chat_row["prompt"], reply) == gold_score(plain_row["prompt"], plain_row["completion"])
    from rlhfkit.data.schema import load_examples

    for name, kind in (("sft", "sft"), ("prefs_train", "preference"), ("prompts_eval", "prompt")):
        assert load_examples(str(chat[name]), kind, "rlhfkit demo")  # every converted file validates
    from rlhfkit.tasks.support import label_noise_ceiling

    def rows(path):
        return [json.loads(line) for line in path.read_text().splitlines()]

    assert label_noise_ceiling(rows(chat["prefs_eval"])) == label_noise_ceiling(rows(files["prefs_eval"]))


def test_log_probs_without_logits_equal_the_plain_ones_on_the_real_model(smollm2, monkeypatch):
    """At V = 49,152 the LM head and the log-probs run together block by block (the [B, T, V] logits are never
    built): the same log-probs, entropies and gradient into the tied embedding as the plain computation."""
    from rlhfkit.accel import onednn, passes, vocab
    from rlhfkit.models import forward

    tok, model = smollm2
    prompts = [chat_prompt_ids(tok, q) for q in QUESTIONS[:2]]
    replies = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in ("Paris.", "Blue, or red.")]
    prompt_ids, prompt_mask = pad_with_mask(prompts, tok.pad_token_id, "left")
    response_ids, response_mask = pad_with_mask(replies, tok.pad_token_id, "right")
    input_ids, attention_mask = torch.cat([prompt_ids, response_ids], 1), torch.cat([prompt_mask, response_mask], 1)
    n = response_ids.shape[1]
    results = []
    for block in (1 << 62, 3 * 49_152):  # one block for everything (the plain path), then 3 positions a block
        monkeypatch.setattr(vocab, "CHUNK_ELEMENTS", block)
        fused = passes.fused_head(model, n * 2)
        assert (fused is not None) == (block < 1 << 62)
        if fused is not None:  # a head swapped to oneDNN here runs its block products through it
            swapped = isinstance(model.get_output_embeddings(), onednn.OneDNNLinear)
            assert isinstance(fused[2], vocab.HeadProduct) == swapped
        model.zero_grad(set_to_none=True)
        with switched("auto"):
            lp, ent, _ = forward.response_token_stats(model, input_ids, attention_mask, n, 0.7, with_entropy=True)
        real = response_mask.bool()
        (lp[real].sum() - 0.1 * ent[real].sum()).backward()
        results.append((lp[real].detach(), ent[real].detach(), model.get_input_embeddings().weight.grad.clone()))
    model.zero_grad(set_to_none=True)
    (lp_a, ent_a, grad_a), (lp_b, ent_b, grad_b) = results
    torch.testing.assert_close(lp_b, lp_a, rtol=0, atol=2e-4)
    torch.testing.assert_close(ent_b, ent_a, rtol=0, atol=2e-4)
    # float32 sums in another order: compared at a thousandth of the gradient's largest entry
    scale = float(grad_a.abs().max())
    assert scale > 0 and float((grad_b - grad_a).abs().max()) < 1e-3 * scale


def test_a_ppo_step_with_lora_and_a_value_head_on_the_tied_model(smollm2_gguf, tmp_path):
    """PPO on the real model: LoRA adapters, a value head on the policy's hidden states, chat prompts, the
    end-of-turn stop and the LM head taken block by block (V = 49,152). The value head learns (its loss is
    finite and it explains something after two updates), and the merged model keeps its head tied."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.trainers.online import train

    from ..trainers.online.conftest import ThanksScorer, parse, read_metrics

    prompts = write_jsonl(
        tmp_path / "p.jsonl", [{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS + QUESTIONS[:1]]
    )
    out = tmp_path / "ppo"
    flags = f"--model {smollm2_gguf} --data {prompts} --output-dir {out} --reward-model none --lora-r 4 "
    flags += "--max-steps 2 --batch-size 4 --max-new-tokens 8 --ppo-epochs 2 --progress false --learning-rate 1e-4"
    train(parse("ppo", flags), scorer=ThanksScorer())
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(torch.isfinite(torch.tensor([r["loss/value"], r["loss/policy"], r["kl/ref"]])).all() for r in rows)
    assert rows[-1]["loss/value"] < rows[0]["loss/value"]  # the value head fits the returns it is shown
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("pack", [False, True])
def test_sft_loss_and_dpo_log_probs_without_logits_equal_the_plain_ones_on_the_real_model(smollm2, monkeypatch, pack):
    """SFT's loss and DPO's sequence log-probs with the LM head on the labelled positions only, block by block (no
    [B, L-1, V] logits of the prompts and padding): the same numbers and gradient into the tied embedding as the
    plain logits path, on padded and on packed rows."""
    from rlhfkit.accel import vocab
    from rlhfkit.data.collate import SequenceBatch
    from rlhfkit.data.encode import IGNORE_INDEX
    from rlhfkit.models import forward
    from rlhfkit.trainers.sft import token_loss_sum

    tok, model = smollm2
    prompts = [chat_prompt_ids(tok, q) for q in QUESTIONS[:3]]
    replies = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in ("Paris.", "Blue.", "No")]
    rows = [p + r for p, r in zip(prompts, replies)]
    input_ids, attention_mask = pad_with_mask(rows, tok.pad_token_id, "right")
    response_mask = torch.zeros_like(input_ids)
    for i, (p, r) in enumerate(zip(prompts, replies)):
        response_mask[i, len(p) : len(p) + len(r)] = 1
    labels = input_ids.masked_fill(response_mask == 0, IGNORE_INDEX)
    sft_batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    seqs = SequenceBatch(input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask)
    results = []
    for block in (1 << 62, 3 * 49_152):  # the plain path, then 3 positions a block
        monkeypatch.setattr(vocab, "CHUNK_ELEMENTS", block)
        calls = []
        monkeypatch.setattr(
            vocab, "head_logprobs", lambda *a, _f=vocab.head_logprobs, **k: calls.append(1) or _f(*a, **k)
        )
        model.zero_grad(set_to_none=True)
        with switched("auto", options={"pack_sequences": pack}):
            loss, count = token_loss_sum(model, sft_batch)
            seq = forward.sequence_logprobs(model, seqs)
        (loss + 0.5 * seq.sum()).backward()
        assert bool(calls) == (block < 1 << 62)
        results.append((loss.detach(), count, seq.detach(), model.get_input_embeddings().weight.grad.clone()))
        monkeypatch.undo()
    model.zero_grad(set_to_none=True)
    (loss_a, count_a, seq_a, grad_a), (loss_b, count_b, seq_b, grad_b) = results
    assert count_a == count_b == int(response_mask.sum())
    # sums over ~20 tokens of log-softmaxes over 49,152 logits, taken block by block or at once: the two orders of
    # fp32 sums (and the CPU's kernels, which may differ between the paths) differ by a few parts in 1e6
    torch.testing.assert_close(loss_b, loss_a, rtol=2e-5, atol=1e-4)
    torch.testing.assert_close(seq_b, seq_a, rtol=2e-5, atol=1e-4)
    scale = float(grad_a.abs().max())
    assert scale > 0 and float((grad_b - grad_a).abs().max()) < 1e-3 * scale
