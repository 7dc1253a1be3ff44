"""`rlhfkit revise`: the supervised stage of Constitutional AI (Bai et al. 2022, §3).

For each prompt, with one principle drawn at random (seeded):
  1. the model answers the prompt (as `rlhfkit generate` samples it);
  2. it is asked to critique its answer by the principle;
  3. it is asked to rewrite the answer, following the principle and its critique.

    OUT/sft.jsonl        prompt + the revision as the completion (`rlhfkit sft` reads it)
    OUT/pairs.jsonl      prompt, chosen = the revision, rejected = the first answer (`rlhfkit rm` / `dpo`)
    OUT/revisions.jsonl  every prompt's principle, answer, critique and revision
    OUT/report.json      counts and the principles
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from tqdm.auto import tqdm

from rlhfkit.config.judging import ReviseConfig
from rlhfkit.data.encode import encode_prompt, prompt_token_ids
from rlhfkit.data.schema import Text, load_examples
from rlhfkit.errors import UserError, option
from rlhfkit.files import write_json, write_jsonl
from rlhfkit.judging.prompts import as_messages, critique_request, read_principles, revision_request
from rlhfkit.models.loading import load_causal_lm, load_tokenizer, position_limit
from rlhfkit.models.sampling import decode, sample_responses
from rlhfkit.training.runtime import pick_device, seed_everything

COMMAND = "rlhfkit revise"
logger = logging.getLogger(__name__)


def _completion(prompt: Text, text: str) -> Text:
    """A reply in the form of its prompt: after a string prompt a string (starting with a space, as a sampled
    continuation does), after a conversation an assistant message."""
    text = text.strip()
    return " " + text if isinstance(prompt, str) else [{"role": "assistant", "content": text}]


def run(cfg: ReviseConfig) -> dict:
    """Entry point of `rlhfkit revise`; returns the report (also OUT/report.json)."""
    r = cfg.revise
    # 1. Every prompt checked, and the principles read, before the model loads.
    examples = load_examples(r.data, "prompt", COMMAND)
    principles = read_principles(r.principles)
    rng = random.Random(r.seed)
    drawn = [rng.choice(principles) for _ in examples]
    out = Path(r.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot create {option('output_dir')} ({exc.strerror})") from None

    tokenizer = load_tokenizer(cfg.model.model, cfg.model.trust_remote_code)
    model = load_causal_lm(cfg.model.model, cfg.model.trust_remote_code, tokenizer)
    device = pick_device(r.cpu)
    model.to(device).eval()
    seed_everything(r.seed)
    # each step's prompt keeps its last tokens, leaving room in the model's positions for the reply it samples
    limit, positions = r.max_prompt_length, position_limit(cfg.model.model)
    if positions is not None:
        limit = min(limit, positions[0] - cfg.generation.max_new_tokens)
        if limit < 1:
            raise UserError(
                f"{option('max_new_tokens', cfg.generation.max_new_tokens)} leaves no room for a prompt in the "
                f"model's {positions[0]} positions (its {positions[1]})"
            )

    def sample(prompts_ids: list[list[int]], bar) -> list[str]:
        ids = sample_responses(model, tokenizer, prompts_ids, cfg.generation, r.batch_size, device, bar.update)
        return [decode(tokenizer, x) for x in ids]

    with tqdm(total=3 * len(examples), desc="revise", unit="sample", dynamic_ncols=True, disable=not r.progress) as bar:
        # 2. The first answers, sampled from the prompts as they are.
        answers = sample([encode_prompt(tokenizer, ex.prompt, limit) for ex in examples], bar)
        # 3. The critiques: the conversation so far, then the critique request.
        talks = [
            as_messages(ex.prompt) + [{"role": "assistant", "content": a.strip()}, _user(critique_request(p))]
            for ex, a, p in zip(examples, answers, drawn)
        ]
        critiques = sample([prompt_token_ids(tokenizer, t)[-limit:] for t in talks], bar)
        # 4. The revisions: the critique, then the revision request.
        talks = [
            t + [{"role": "assistant", "content": c.strip()}, _user(revision_request(p))]
            for t, c, p in zip(talks, critiques, drawn)
        ]
        revisions = sample([prompt_token_ids(tokenizer, t)[-limit:] for t in talks], bar)

    # 5. The rows: a revision that came out empty is left out of sft.jsonl, one equal to its answer of pairs.jsonl.
    sft, pairs, record = [], [], []
    for ex, p, a, c, v in zip(examples, drawn, answers, critiques, revisions):
        record.append({"prompt": ex.prompt, "principle": p, "answer": a, "critique": c, "revision": v})
        if not v.strip():
            continue
        sft.append({"prompt": ex.prompt, "completion": _completion(ex.prompt, v)})
        if v.strip() != a.strip() and a.strip():
            pairs.append(
                {"prompt": ex.prompt, "chosen": _completion(ex.prompt, v), "rejected": _completion(ex.prompt, a)}
            )
    report = {
        "model": cfg.model.model,
        "prompts": len(examples),
        "revisions": len(sft),
        "empty_revisions": len(examples) - len(sft),
        "pairs": len(pairs),
        "principles": list(principles),
    }
    write_jsonl(out / "sft.jsonl", sft)
    write_jsonl(out / "pairs.jsonl", pairs)
    write_jsonl(out / "revisions.jsonl", record)
    write_json(out / "report.json", report)
    logger.info(f"wrote {len(sft)} revisions to {out / 'sft.jsonl'} and {len(pairs)} pairs to {out / 'pairs.jsonl'}")
    return report


def _user(text: str) -> dict:
    return {"role": "user", "content": text}
