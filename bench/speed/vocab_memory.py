"""Peak memory and time of the log-probs and entropy of one batch at a real vocabulary, with their backward:
from the logits plainly, from the logits block by block (``chunked_logprobs`` / ``chunked_entropy``), and with
the LM head taken block by block as well (``head_logprobs``: the logits never built). Each way runs in its own
process, so its peak RSS is its own.

    python -m bench vocab_memory [--batch 16] [--length 128] [--vocab 49152] [--hidden 576]

The defaults are a PPO / GRPO batch of 16 completions of 128 tokens on SmolLM2-135M's head (49,152 x 576).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

MODES = {
    "plain": "logits, then the plain formulas",
    "chunked": "logits, then log-probs and entropy block by block",
    "fused": "LM head + log-probs + entropy block by block (no logits)",
}


def one(mode: str, batch: int, length: int, vocab: int, hidden_size: int) -> dict:
    import torch

    from rlhfkit.accel import vocab as vocab_blocks

    if mode == "plain":
        vocab_blocks.CHUNK_ELEMENTS = 1 << 62
    torch.manual_seed(0)
    hidden = torch.randn(batch, length, hidden_size, requires_grad=True)
    weight = (torch.randn(vocab, hidden_size) * 0.02).requires_grad_(True)
    labels = torch.randint(vocab, (batch, length))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if mode == "fused":
        logprobs, entropy = vocab_blocks.head_logprobs(hidden, weight, labels, with_entropy=True)
    else:
        logits = hidden @ weight.T
        logprobs, entropy = vocab_blocks.logprobs(logits, labels), vocab_blocks.entropy(logits)
    (logprobs.mean() - 0.01 * entropy.mean()).backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mode": mode, "seconds": seconds, "peak_rss_gb": peak / 1e6, "added_gb": (peak - base) / 1e6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)  # one mode, in a child process
    args = parser.parse_args(argv)
    if args.mode:
        print(json.dumps(one(args.mode, args.batch, args.length, args.vocab, args.hidden)))
        return
    shape = ["--batch", str(args.batch), "--length", str(args.length), "--vocab", str(args.vocab)]
    shape += ["--hidden", str(args.hidden)]
    logits_gb = args.batch * args.length * args.vocab * 4 / 1e9
    print(f"B = {args.batch}, T = {args.length}, V = {args.vocab}, H = {args.hidden}: fp32 logits {logits_gb:.2f} GB")
    print(f"{'way':<60} {'seconds':>8} {'peak RSS GB':>12} {'added GB':>9}")
    for mode, what in MODES.items():
        out = subprocess.run(
            [sys.executable, __file__, "--mode", mode, *shape], capture_output=True, text=True, check=True
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"{what:<60} {r['seconds']:>8.2f} {r['peak_rss_gb']:>12.2f} {r['added_gb']:>9.2f}")


if __name__ == "__main__":
    main()
