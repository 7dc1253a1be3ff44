"""`rlhfkit eval`: sample responses from a policy for held-out prompts and measure them.

Reports mean reward-model score, gold score (when a task judge is named), KL to a reference model,
response length, distinct-1/2 and repetition; writes a JSON file (and the samples beside it).

KL to the reference is the Monte-Carlo estimate over the sampled responses y ~ pi:
``KL(pi || ref) ≈ mean_y Σ_t [log pi(y_t|·) − log ref(y_t|·)]`` (the same k1 sum PPO logs as ``kl/ref``).
``log pi`` is the sampler's own (the logits each token was drawn from), ``log ref`` a forward pass of the
reference over the sampled rows.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from rlhfkit.config.commands import EvalConfig
from rlhfkit.data.collate import chunks, pad_with_mask
from rlhfkit.data.lengths import check_generation_fits, encode_prompts
from rlhfkit.data.schema import load_examples
from rlhfkit.data.templates import render_prompt
from rlhfkit.data.text_stats import text_stats
from rlhfkit.errors import UserError, option
from rlhfkit.inference.diagnostics import agreement, best_of_n, on_policy_agreement
from rlhfkit.models.forward import response_logprobs
from rlhfkit.models.loading import load_causal_lm, load_tokenizer, position_limit
from rlhfkit.models.reward import RewardScorer
from rlhfkit.models.sampling import decode, ended_with_stop, sample_responses, stop_token_ids
from rlhfkit.tasks import get_judge
from rlhfkit.training.distributed import Ranks, gather_objects
from rlhfkit.training.runtime import process_state

logger = logging.getLogger(__name__)


@torch.no_grad()
def sequence_kl(
    policy,
    reference,
    prompt_ids,
    responses,
    pad_id: int,
    temperature: float,
    device,
    batch_size: int = 32,
    policy_logprobs: list[list[float]] | None = None,
) -> list[float]:
    """Per response: Σ_t log pi − log ref over its tokens (k1 estimate of the sequence KL). ``policy_logprobs``:
    log pi of every response's tokens, as the sampler gave them (``sample_responses(logprobs=...)``); without
    them the policy runs a forward pass too."""
    out = []
    for idx in chunks(list(range(len(responses))), batch_size):
        q, qm = pad_with_mask([prompt_ids[i] for i in idx], pad_id, "left", device)
        r, rm = pad_with_mask([responses[i] for i in idx], pad_id, "right", device)
        ids, mask, T = torch.cat([q, r], 1), torch.cat([qm, rm], 1), r.shape[1]
        ref = (response_logprobs(reference, ids, mask, T, temperature) * rm).sum(dim=1).tolist()
        if policy_logprobs is not None:
            out += [sum(policy_logprobs[i]) - ref_sum for i, ref_sum in zip(idx, ref)]
        else:
            own = (response_logprobs(policy, ids, mask, T, temperature) * rm).sum(dim=1).tolist()
            out += [a - b for a, b in zip(own, ref)]
    return out


def evaluate_policy(
    policy_dir: str,
    prompts: list,
    generation,
    *,
    reward_model: str | RewardScorer | None = "",
    reference=None,
    judge=None,
    seed: int = 0,
    batch_size: int = 32,
    max_prompt_length: int = 128,
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    ranks: Ranks | None = None,
    data_path: str = "the prompts",
) -> tuple[dict, list[dict]]:
    """Sample one response per prompt and measure them; returns (metrics, sample rows). ``reward_model`` and
    ``reference``: a folder to load, or one already loaded (a ``RewardScorer``, a causal LM) when several
    policies are measured against the same ones; empty or None: not measured. With ``ranks`` of several
    processes, each samples and scores a contiguous share (seed + rank) and every process returns the metrics
    and rows of all prompts."""
    ranks = ranks or Ranks()
    tokenizer = load_tokenizer(policy_dir, trust_remote_code)
    every = encode_prompts(tokenizer, prompts, max_prompt_length, generation.truncate_prompts, data_path)
    check_generation_fits(policy_dir, position_limit(policy_dir), every, generation.max_new_tokens)
    policy = load_causal_lm(policy_dir, trust_remote_code, tokenizer).to(device).eval()
    span = ranks.span(len(prompts))
    mine, prompt_ids = [prompts[i] for i in span], [every[i] for i in span]
    torch.manual_seed(seed + ranks.rank)
    sampled_logprobs: list[list[float]] = []
    responses = sample_responses(
        policy, tokenizer, prompt_ids, generation, batch_size, device, logprobs=sampled_logprobs
    )
    texts = [decode(tokenizer, r) for r in responses]
    finished = ended_with_stop(responses, stop_token_ids(policy, tokenizer))  # cut-off replies: no EOS
    rows = [
        {"prompt": p, "response": t, "tokens": len(r), "finished": f}
        for p, t, r, f in zip(mine, texts, responses, finished)
    ]
    scorer = reward_model
    if isinstance(reward_model, (str, Path)):
        scorer = RewardScorer.load(str(reward_model), device, trust_remote_code) if str(reward_model) else None
    if scorer is not None:
        for row, s in zip(rows, scorer.score(mine, texts, finished=finished).mean.tolist()):
            row["score"] = s
    if judge is not None:
        for row, p, t in zip(rows, mine, texts):
            row["gold"] = judge(render_prompt(tokenizer, p), t)
    ref = reference
    if isinstance(reference, (str, Path)):
        ref = load_causal_lm(str(reference), trust_remote_code, tokenizer).to(device).eval() if str(reference) else None
    if ref is not None:
        own = sampled_logprobs if len(sampled_logprobs) == len(responses) else None  # else: a forward pass
        kls = sequence_kl(
            policy, ref, prompt_ids, responses, tokenizer.pad_token_id, generation.temperature, device, batch_size, own
        )
        for row, kl in zip(rows, kls):
            row["kl"] = kl
    rows = gather_objects(rows)  # every process's, in prompt order
    return summarize(rows), rows


def reply_text(reply) -> str:
    """A reply as the judge reads it: the text itself, or a chat reply's (assistant) messages' content."""
    if isinstance(reply, str):
        return reply
    return "\n".join(m.get("content", "") for m in reply if isinstance(m, dict))


def pair_agreement(scorer: RewardScorer, judge, tokenizer, pairs: list[dict], batch_size: int = 32) -> dict:
    """The reward model on held-out labelled pairs (rows with prompt, chosen, rejected): ``rm/pairs_accuracy``,
    the share it scores chosen above rejected (ties half); with a ``judge`` also ``rm_judge/pairs_agreement``,
    its agreement with the judge's ranking of the two replies (``diagnostics.agreement``; pairs the judge scores
    equal left out), and ``judge/pairs_accuracy``, the judge's own agreement with the labels (their noise
    ceiling)."""
    prompts = [row["prompt"] for row in pairs]
    chosen = scorer.score(prompts, [reply_text(r["chosen"]) for r in pairs], batch_size).mean.tolist()
    rejected = scorer.score(prompts, [reply_text(r["rejected"]) for r in pairs], batch_size).mean.tolist()
    labels = agreement([(c, r, 1.0, 0.0) for c, r in zip(chosen, rejected)])
    out = {"rm/pairs": float(labels["pairs"]), "rm/pairs_accuracy": labels["agreement"]}
    if judge is not None:
        rendered = [render_prompt(tokenizer, p) for p in prompts]
        gold_c = [judge(p, reply_text(r["chosen"])) for p, r in zip(rendered, pairs)]
        gold_r = [judge(p, reply_text(r["rejected"])) for p, r in zip(rendered, pairs)]
        with_judge = agreement(list(zip(chosen, rejected, gold_c, gold_r)))
        judge_labels = agreement([(gc, gr, 1.0, 0.0) for gc, gr in zip(gold_c, gold_r)])
        out.update(
            {
                "rm_judge/pairs": float(with_judge["pairs"]),
                "rm_judge/pairs_agreement": with_judge["agreement"],
                "judge/pairs_accuracy": judge_labels["agreement"],
            }
        )
    return out


def sample_diagnostics(rows: list[dict]) -> dict:
    """From several scored and judged replies per prompt: the reward model's agreement with the judge on pairs of
    the policy's own replies, and best-of-N headroom (``rlhfkit.inference.diagnostics``); empty without them."""
    if not rows or "score" not in rows[0] or "gold" not in rows[0]:
        return {}
    on_policy = on_policy_agreement(rows)
    out = {
        "rm_judge/on_policy_pairs": float(on_policy["pairs"]),
        "rm_judge/on_policy_agreement": on_policy["agreement"],
    }
    best = best_of_n(rows)
    if best["n"] >= 2:
        out.update({f"best_of_n/{k}": float(v) if v is not None else None for k, v in best.items()})
    return out


def summarize(rows: list[dict]) -> dict[str, float]:
    """The metrics of ``evaluate_policy``'s rows: means of the per-row measures, text statistics."""
    texts = [row["response"] for row in rows]
    metrics: dict[str, float] = {"n": float(len(rows))}
    metrics.update({f"response/{k}": v for k, v in text_stats(texts).items()})
    metrics["response/tokens"] = sum(row["tokens"] for row in rows) / len(rows)
    for key, name in (("score", "reward/score"), ("gold", "reward/gold"), ("kl", "kl/ref")):
        if rows and key in rows[0]:
            metrics[name] = sum(row[key] for row in rows) / len(rows)
    return metrics


def run(cfg: EvalConfig) -> dict:
    examples = load_examples(cfg.io.data, "prompt", "rlhfkit eval")[: cfg.eval.num_prompts or None]
    pairs = load_examples(cfg.eval.pairs, "preference", "rlhfkit eval") if cfg.eval.pairs else []
    judge = None
    if cfg.eval.gold_judge:
        try:
            judge = get_judge(cfg.eval.gold_judge)
        except ValueError as exc:
            raise UserError(f"{option('gold_judge')}: {exc}") from None
    state = process_state(cfg.io.cpu, cfg.io.dist_timeout)
    ranks = Ranks(state.process_index, state.num_processes)
    # loaded once: it scores the samples and, with --pairs, the held-out pairs
    scorer = (
        RewardScorer.load(cfg.eval.reward_model, state.device, cfg.model.trust_remote_code)
        if cfg.eval.reward_model
        else None
    )
    metrics, rows = evaluate_policy(
        cfg.model.model,
        [ex.prompt for ex in examples] * cfg.eval.samples_per_prompt,  # the list repeated: each copy sampled anew
        cfg.generation,
        reward_model=scorer,
        reference=cfg.eval.reference_model,
        judge=judge,
        seed=cfg.io.seed,
        batch_size=cfg.io.batch_size,
        max_prompt_length=cfg.io.max_prompt_length,
        device=state.device,
        trust_remote_code=cfg.model.trust_remote_code,
        ranks=ranks,
        data_path=cfg.io.data,
    )
    if not ranks.is_main:
        return metrics
    metrics.update(sample_diagnostics(rows))
    if pairs:  # the config's check: --pairs comes with --reward-model
        tokenizer = load_tokenizer(cfg.model.model, cfg.model.trust_remote_code)
        held_out = [{"prompt": ex.prompt, "chosen": ex.chosen, "rejected": ex.rejected} for ex in pairs]
        metrics.update(pair_agreement(scorer, judge, tokenizer, held_out, cfg.io.batch_size))
    out = Path(cfg.io.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(metrics, indent=2) + "\n")
    with out.with_suffix(".samples.jsonl").open("w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    logger.info(json.dumps(metrics, indent=2))
    return metrics
