"""Runs `rlhfkit ppo` (bench/vs_trl/ppo_vs_trl.py) or `rlhfkit grpo` (bench/vs_trl/grpo_vs_trl.py) and records when each
step ends.

    python bench/harness/rlhfkit_runner.py RESULT.json [COMMAND] -- [flags of rlhfkit COMMAND]

COMMAND is one of the online-RL commands (ppo, grpo, rloo; default ppo). It runs exactly as on the command
line (``rlhfkit.cli.main.main([COMMAND, ...])``); the only addition is a wrapper around ``OnlineTrainer.step``
that reads the clock and the rollout's response mask after each step. Writes RESULT.json with step end
times, generated tokens per step, whether the policy samples through rlhfkit's lean decode step, the start-up
time (process start to the first step), the peak RSS of this process and, on a GPU, the peak GPU memory
allocated and reserved by torch's caching allocator.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

START = time.perf_counter()

from rlhfkit.cli.main import main as rlhfkit_main  # noqa: E402
from rlhfkit.trainers.online.trainer import OnlineTrainer  # noqa: E402


def instrument(record: dict) -> None:
    original = OnlineTrainer.step

    def step(self, batch):
        if record["first_step_start"] is None:
            from rlhfkit.accel.decode import _supported

            record["lean_decode"] = _supported(self.policy)  # whether sampling runs rlhfkit's own decode step
            record["first_step_start"] = time.perf_counter()
        result = original(self, batch)
        record["step_ends"].append(time.perf_counter())
        rollout = result.rollout
        record["generated_tokens"].append(int(rollout.response_mask.sum()) if rollout is not None else 0)
        return result

    OnlineTrainer.step = step


def main(argv: list[str]) -> int:
    head = argv[: argv.index("--")] if "--" in argv else []
    if len(head) not in (1, 2):
        print(__doc__, file=sys.stderr)
        return 2
    result_path, command, flags = Path(head[0]), head[1] if len(head) == 2 else "ppo", argv[len(head) + 1 :]
    record: dict = {"first_step_start": None, "step_ends": [], "generated_tokens": []}
    instrument(record)
    code = rlhfkit_main([command, *flags])
    if code != 0:
        return code
    import torch

    begin = record["first_step_start"]
    result = {
        "framework": "rlhfkit",
        "command": command,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "startup_s": begin - START,
        "train_s": record["step_ends"][-1] - begin,
        "step_ends": [t - begin for t in record["step_ends"]],
        "generated_tokens": record["generated_tokens"],
        "lean_decode": record.get("lean_decode"),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if torch.cuda.is_available():  # the caching allocator's peaks: tensors, and what it held from the driver
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        result["peak_gpu_reserved_mb"] = torch.cuda.max_memory_reserved() / 2**20
    result_path.parent.mkdir(parents=True, exist_ok=True)
    result_path.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
