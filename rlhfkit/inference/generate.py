"""`rlhfkit generate`: sample responses for prompts and write JSONL rows.

One sample per prompt writes ``{"prompt", "response", ...}``; ``--num-samples K`` writes
``{"prompt", "responses": [r1, ..., rK], ...}``, the candidate format `rlhfkit label` reads. Rows come out
in input order; fields of the input row besides ``prompt`` are passed through. Under
``torchrun``/``accelerate launch`` each process samples a contiguous share of the prompts (with its own
seed + rank) and the first process writes all rows.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tqdm.auto import tqdm

from rlhfkit.config.commands import GenerateConfig
from rlhfkit.data.lengths import check_generation_fits, encode_prompts
from rlhfkit.data.readers import row_location
from rlhfkit.data.schema import load_examples
from rlhfkit.errors import UserError, option
from rlhfkit.models.loading import load_causal_lm, load_tokenizer, position_limit
from rlhfkit.models.sampling import decode, sample_responses
from rlhfkit.training.distributed import Ranks, gather_objects
from rlhfkit.training.runtime import process_state, seed_everything

logger = logging.getLogger(__name__)


def run(cfg: GenerateConfig) -> Path:
    """Entry point of `rlhfkit generate`; returns the output path."""
    # 1. Validate every prompt row before loading the model.
    examples = load_examples(cfg.io.data, "prompt", "rlhfkit generate")
    out = Path(cfg.io.output)
    if out.is_dir():
        raise UserError(f"{out}: {option('output')} is a directory; give a .jsonl file path")
    try:  # fail before sampling, not after
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot create the folder of {option('output')} ({exc.strerror})") from None

    # 2. Model, tokenizer, prompt ids.
    tokenizer = load_tokenizer(cfg.model.model, cfg.model.trust_remote_code)
    prompts, truncate = [ex.prompt for ex in examples], cfg.generation.truncate_prompts
    prompts_ids = encode_prompts(tokenizer, prompts, cfg.io.max_prompt_length, truncate, cfg.io.data)
    check_generation_fits(cfg.model.model, position_limit(cfg.model.model), prompts_ids, cfg.generation.max_new_tokens)
    model = load_causal_lm(cfg.model.model, cfg.model.trust_remote_code, tokenizer)
    state = process_state(cfg.io.cpu, cfg.io.dist_timeout)
    ranks, device = Ranks(state.process_index, state.num_processes), state.device
    model.to(device)
    for i, ids in enumerate(prompts_ids):
        if not ids:
            raise UserError(f"{row_location(cfg.io.data, i)}: field 'prompt': encodes to no tokens")

    # 3. Sample: this process's share of the prompts, each repeated K times in a row, so a prompt's K samples
    #    are neighbours in the output.
    per_prompt = cfg.samples.num_samples
    seed_everything(cfg.io.seed + ranks.rank)
    mine = ranks.span(len(examples))
    bar = tqdm(
        total=len(mine) * per_prompt, desc="generate", unit="sample", dynamic_ncols=True, disable=not ranks.is_main
    )
    with bar:
        mine_ids = [prompts_ids[i] for i in mine for _ in range(per_prompt)]
        responses = sample_responses(
            model, tokenizer, mine_ids, cfg.generation, cfg.io.batch_size, device, progress=bar.update
        )
    responses = gather_objects(responses)  # every process's, in input order
    if not ranks.is_main:
        return out
    texts = [decode(tokenizer, ids) for ids in responses]

    # 4. Write rows in input order.
    rows = []
    for i, ex in enumerate(examples):
        samples = texts[i * per_prompt : (i + 1) * per_prompt]
        row = {"prompt": ex.prompt, **({"response": samples[0]} if per_prompt == 1 else {"responses": samples})}
        row.update({k: v for k, v in ex.extra.items() if k not in row})
        rows.append(json.dumps(row, ensure_ascii=False) + "\n")
    try:
        out.write_text("".join(rows), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{out}: cannot write {option('output')} ({exc.strerror})") from None
    logger.info("wrote %d responses (%d prompts x %d) to %s", len(responses), len(examples), per_prompt, out)
    return out
