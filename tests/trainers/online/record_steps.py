"""Run ``rlhfkit ARGS`` (under torchrun) recording, per step and process, what the online loop computed.

Writes ``OUT/record-rank-R.pt``: one dict per step with this process's data rows and prompts, the whole
batch it gathered before steps 5-6 and what ``assign_rewards_and_advantages`` made of it, and beta before and
after the step.
"""

import os
import sys
from pathlib import Path

import torch

from rlhfkit.cli.main import main
from rlhfkit.trainers.online.trainer import OnlineTrainer

records: list[dict] = []
assign, step = OnlineTrainer.assign_rewards_and_advantages, OnlineTrainer.step


def recording_assign(self, r, metrics):
    out = assign(self, r, metrics)
    records.append({"beta": self.kl_ctl.value, "before": _tensors(r), "after": _tensors(out)})
    return out


def recording_step(self, batch):
    result = step(self, batch)
    records[-1].update(rows=list(batch.rows), prompts=list(batch.prompts), beta_after=self.kl_ctl.value)
    records[-1]["kl/ref"] = result.metrics.get("kl/ref")
    return result


def _tensors(r) -> dict:
    return {k: v.detach().cpu().clone() for k, v in vars(r).items() if isinstance(v, torch.Tensor)}


OnlineTrainer.assign_rewards_and_advantages, OnlineTrainer.step = recording_assign, recording_step
code = main(sys.argv[1:])
out = Path(sys.argv[sys.argv.index("--output-dir") + 1])
torch.save(records, out / f"record-rank-{os.environ.get('RANK', '0')}.pt")
sys.exit(code)
