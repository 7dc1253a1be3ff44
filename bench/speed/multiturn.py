"""Step time of multi-turn rollouts against single-turn ones of about the same length.

A GRPO step on a small GPT-2 (``init-model --size small``, 7.4M parameters; 16 rows, G = 4), two ways:
- multi-turn: an environment that answers every reply with a short user message, for 3 model turns of up to
  32 tokens each (each turn re-prefills its rows' whole conversation);
- single-turn: one reply of up to 3 x 32 tokens plus the length of the two spliced messages.
A randomly initialised model rarely emits EOS, so both runs stop replies by a set of stop tokens chosen so
that a reply's expected length is the turn's (multi-turn) or the whole conversation's (single-turn): lengths
vary from row to row as a trained model's do. The table gives the medians over the steps (the first left
out) of the step's phases and the conversation's tokens (policy tokens; all tokens, prompt included), and
the generation's milliseconds per policy token.

    python -m bench multiturn [--steps 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

ENV = """
class Chat:
    def reset(self, row):
        self.turn = 0
        return None

    def step(self, reply):
        self.turn += 1
        return ("please go on", float(len(reply) % 3), self.turn >= 3)
"""
REWARD = """
def length(prompts, completions, **kwargs):  # completions: the messages after each conversation's opening
    return [float(len(c[-1]["content"]) % 3) for c in completions]
"""


def build(root: Path) -> Path:
    import rlhfkit
    from rlhfkit.tasks import get_task

    (root / "corpus.txt").write_text(get_task("support").corpus_text())
    rlhfkit.init_model(output_dir=str(root / "model"), corpus=str(root / "corpus.txt"), size="small", seed=0)
    rows = [{"prompt": [{"role": "user", "content": f"tell me about order {i}"}]} for i in range(64)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "env.py").write_text(ENV)
    (root / "reward.py").write_text(REWARD)
    return root / "model"


def with_stops(model_dir: Path, out: Path, mean_length: int) -> Path:
    """A copy of the model whose generation config lists enough stop tokens for replies of ~mean_length."""
    import shutil

    from transformers import AutoTokenizer, GenerationConfig

    shutil.copytree(model_dir, out, dirs_exist_ok=True)
    vocab = len(AutoTokenizer.from_pretrained(out))
    n = max(1, round(vocab / mean_length))
    config = GenerationConfig.from_pretrained(out)
    config.eos_token_id = list(range(vocab - n, vocab))
    config.save_pretrained(out)
    return out


PREFILL = {"sampling_s": 0.0, "prefill_s": 0.0}


def timing_prefill():
    """Wrap the multi-turn sampler so that each round also times a prefill-only pass (one new token) over the
    same conversations: the share of a round's sampling that re-reading the conversation costs, which keeping
    the key / value cache between rounds would save. The extra passes are timed apart from the rounds."""
    import dataclasses
    import time

    import torch

    import rlhfkit.multiturn.rollout as rollout

    sample = rollout.sample_responses

    def timed(model, tokenizer, contexts, generation, batch_size, device, **kwargs):
        start = time.perf_counter()
        out = sample(model, tokenizer, contexts, generation, batch_size, device, **kwargs)
        PREFILL["sampling_s"] += time.perf_counter() - start
        one = dataclasses.replace(generation, max_new_tokens=1)
        with torch.random.fork_rng(devices=[]):
            start = time.perf_counter()
            sample(model, tokenizer, contexts, one, batch_size, device, **kwargs)
            PREFILL["prefill_s"] += time.perf_counter() - start
        return out

    rollout.sample_responses = timed


def run(root: Path, model: Path, multi: bool, steps: int, threads: int, name: str = "") -> dict:
    import torch

    import rlhfkit

    torch.set_num_threads(threads)
    out = root / (name or ("multi" if multi else "single"))
    options = dict(
        model=str(model),
        data=str(root / "prompts.jsonl"),
        output_dir=str(out),
        batch_size=16,
        num_generations=4,
        max_steps=steps,
        learning_rate=1e-4,
        progress=False,
        seed=0,
    )
    if multi:
        options.update(env=str(root / "env.py") + ":Chat", max_turns=3, max_new_tokens=32)
    else:
        options.update(reward_fns=[str(root / "reward.py") + ":length"], max_new_tokens=3 * 32 + 2 * 8)
    rlhfkit.grpo(**options)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][1:]
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    if not multi:  # a single-turn row's tokens: its prompt's and its reply's
        from transformers import AutoTokenizer

        from rlhfkit.data.encode import encode_prompt

        tok = AutoTokenizer.from_pretrained(model)
        prompts = [json.loads(x)["prompt"] for x in (root / "prompts.jsonl").read_text().splitlines()]
        prompt_tokens = statistics.mean(len(encode_prompt(tok, p, 10_000)) for p in prompts)
        for r in rows:
            r["rollout/tokens"], r["rollout/turns"] = r["response/length"] + prompt_tokens, 1.0
    return {
        "run": "multi-turn (3 turns)" if multi else "single-turn",
        "step_s": med("time/step_s"),
        "generate_s": med("time/generate_s"),
        "forward_s": med("time/forward_s"),
        "update_s": med("time/update_s"),
        "policy_tokens": med("response/length"),
        "all_tokens": med("rollout/tokens"),
        "turns": med("rollout/turns"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build(root)
        results = [
            run(root, with_stops(model, root / "m32", 32), True, args.steps, args.threads),
            run(root, with_stops(model, root / "m112", 3 * 32 + 2 * 8), False, args.steps, args.threads),
        ]
        timing_prefill()  # a third run, apart: its extra prefill passes would slow the timed steps
        run(root, root / "m32", True, args.steps, args.threads, name="multi-prefill")
    print("| run | step s | generate s | teacher-forced s | update s | policy tokens | tokens (all) | turns "
          "| generate ms / policy token |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        per_token = 1000 * r["generate_s"] / (16 * r["policy_tokens"])
        print(
            f"| {r['run']} | {r['step_s']:.2f} | {r['generate_s']:.2f} | {r['forward_s']:.2f} | {r['update_s']:.2f} "
            f"| {r['policy_tokens']:.1f} | {r['all_tokens']:.1f} | {r['turns']:.1f} | {per_token:.1f} |"
        )
    share = PREFILL["prefill_s"] / max(PREFILL["sampling_s"], 1e-9)
    print(f"\nmulti-turn: re-reading the conversations (prefill) took {100 * share:.0f}% of the rounds' sampling time")


if __name__ == "__main__":
    main()
