"""`rlhfkit score`: reward-model scores for prompt/response rows.

Each output line is the input row unchanged (every field kept, same order of rows) plus ``score``,
and ``score_std`` (the spread across members) for an ensemble reward model. Under ``torchrun``/``accelerate
launch`` each process scores a contiguous share of the rows and the first process writes them all.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rlhfkit.config.commands import ScoreConfig
from rlhfkit.data.readers import read_rows
from rlhfkit.data.schema import to_example
from rlhfkit.errors import UserError, option
from rlhfkit.models.reward import RewardScorer
from rlhfkit.training.distributed import Ranks, gather_objects
from rlhfkit.training.runtime import process_state

logger = logging.getLogger(__name__)


def run(cfg: ScoreConfig) -> Path:
    # 1. Validate every row before loading the model.
    rows = read_rows(cfg.io.data)
    examples = [to_example(row, "prompt_response", "rlhfkit score") for row in rows]
    output = Path(cfg.io.output)
    if output.is_dir():
        raise UserError(f"{output}: {option('output')} is a directory; give a file name")

    # 2. Score with the reward model's own tokenizer.
    state = process_state(cfg.io.cpu, cfg.io.dist_timeout)
    ranks = Ranks(state.process_index, state.num_processes)
    scorer = RewardScorer.load(cfg.score.reward_model, state.device, cfg.score.trust_remote_code)
    scorer.max_prompt_length = cfg.io.max_prompt_length
    mine = [examples[i] for i in ranks.span(len(examples))]
    scores = scorer.score([ex.prompt for ex in mine], [ex.response for ex in mine], cfg.io.batch_size)

    # 3. Write the rows in input order, atomically.
    mean = gather_objects(scores.mean.tolist())
    std = gather_objects(scores.std.tolist()) if scores.std is not None else None
    if not ranks.is_main:
        return output
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for i, row in enumerate(rows):
            record = {**row.data, "score": mean[i]}
            if std is not None:
                record["score_std"] = std[i]
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(output)
    logger.info("wrote %d scored rows to %s", len(rows), output)
    return output
