"""A scripted policy for multi-turn tests: the sampler is replaced by a function of the conversation so far,
so a test knows exactly which tokens the "model" produced and can check the splice and the masks around them.

``install(monkeypatch, reply)``: ``reply(context_text, rng) -> str`` gives the next reply's text; its tokens
(plus EOS) are what the sampler returns. ``rng`` draws from torch's global generator, so a run with a
scripted policy is as reproducible (and as resumable) as one that samples.
"""

from __future__ import annotations

import sys

import torch

import rlhfkit.multiturn.rollout as multiturn_rollout

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
TOOLS = '''
import time

def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b

def broken(a: int) -> int:
    """Always fails."""
    raise ValueError("no luck")

def slow(a: int) -> int:
    """Never returns in time."""
    time.sleep(30)
    return a

def opaque(a: int) -> object:
    """Returns something that is not text."""
    return object()

def length(prompts, completions, **kwargs):
    """The characters of a conversation's messages after its prompt (TRL's multi-turn completions)."""
    return [sum(len(m["content"]) for m in c) / 10 for c in completions]
'''
ENVS = '''
class Counter:
    """Three user turns, a reward after each: 1, 2, 3; state carried across turns."""
    def reset(self, row):
        self.n = 0
        return None
    def step(self, reply):
        self.n += 1
        return (f"turn {self.n} done", float(self.n), self.n >= 3)

class Scored:
    """Two user turns; rewards depend on the reply and on the turn (state the instance carries). With
    RLHFKIT_TEST_FAIL_AFTER=N set, the reset after the N-th of this module's resets raises."""
    resets = 0
    def reset(self, row):
        import os
        Scored.resets += 1
        limit = int(os.environ.get("RLHFKIT_TEST_FAIL_AFTER", "0"))
        if limit and Scored.resets > limit:
            raise ConnectionError("lost the game server")
        self.turn = 0
        return None
    def step(self, reply):
        self.turn += 1
        reward = (1.0 if "yes" in reply else -0.5) * self.turn
        return ("and again?" if self.turn < 2 else None, reward, self.turn >= 2)

class Exploding:
    def reset(self, row):
        return None
    def step(self, reply):
        raise RuntimeError("the board is on fire")
'''


def reply_ids(tokenizer, text: str, space: bool = True) -> list[int]:
    """A reply's tokens and EOS; ``space``: after a plain template's "Assistant:", a reply starts with a space."""
    return tokenizer((" " if space else "") + text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def install(monkeypatch, reply, space: bool = True):
    """Replace the multi-turn sampler with ``reply(context_text, rng)``."""

    def sample(model, tokenizer, contexts, generation, batch_size, device, **_):
        out = []
        for ids in contexts:
            text = reply(tokenizer.decode(ids), lambda n: int(torch.randint(n, ())))
            out.append(reply_ids(tokenizer, text, space)[: generation.max_new_tokens])
        return out

    monkeypatch.setattr(multiturn_rollout, "sample_responses", sample)


def call_then_answer(context: str, rng) -> str:
    """Call the tool first; once a tool result is in the conversation, answer (one of two answers)."""
    if "Tool:" not in context and "<|im_start|>tool" not in context:
        return CALL
    return ["the answer is 5", "it is 5"][rng(2)]


if __name__ == "__main__":  # run a CLI command with the scripted policy (for tests under torchrun)
    from rlhfkit.cli.main import main

    class _Patch:
        def setattr(self, obj, name, value):
            setattr(obj, name, value)

    install(_Patch(), lambda context, rng: call_then_answer(context, lambda n: 0))
    sys.exit(main(sys.argv[1:]))
