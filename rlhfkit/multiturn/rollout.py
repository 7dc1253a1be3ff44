"""Conversations sampled turn by turn: the policy replies, tools and the environment answer, until done.

All rows of a batch advance together, one model turn per round: every row still going is sampled in one
batch (``sample_responses``, the same sampler as single-turn rollouts), then each reply is parsed and
answered on the CPU, and the answer's tokens are spliced after the reply (``Splicer``). Rows that finish
drop out of the next round. Each round prefills its rows' whole conversation again rather than keeping the
key / value cache between rounds: the prefill is one batched forward, a small part of a round next to the
token-by-token decode (``python -m bench multiturn`` measures it), and it keeps the sampler shared and simple.

A conversation ends when the reply has no tool call (a final answer), the environment says done (or has no
next message), or a limit is reached: --max-turns model turns, --max-total-tokens tokens (prompt included),
or a reply cut off at --max-new-tokens. The last two, and a last turn that still asked for a tool, count as
truncated: such a row is not ``finished`` (so --mask-truncated-completions and --missing-eos-penalty apply).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from rlhfkit.errors import UserError, option
from rlhfkit.models.sampling import sample_responses, stop_token_ids
from rlhfkit.multiturn.envs import EnvCaller, load_env
from rlhfkit.multiturn.template import Splicer
from rlhfkit.multiturn.tools import ToolRunner, load_tools, parse_tool_calls


@dataclass
class Conversation:
    """One rollout row. ``ids``: every token after ``prompt_ids`` (the model's and the spliced ones);
    ``actions[i]``: 1 where ``ids[i]`` was sampled by the policy; ``turn_ends``: index in ``ids`` of each
    model turn's last token; ``turn_rewards``: ``(index in ids, reward)`` for each reward the environment
    gave; ``reply_ids``: the last reply's tokens; ``opening``: how many of the first ``messages`` the
    conversation opened with (the row's prompt, or the environment's opening); ``logprobs``: with a sampling
    engine, its log-prob of each token of ``ids`` (0 on the spliced ones), else None."""

    messages: list[dict]
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    turn_rewards: list[tuple[int, float]] = field(default_factory=list)
    reply_ids: list[int] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    finished: bool = False
    truncated: bool = False
    done: bool = False
    env: object = None
    opening: int = 0
    logprobs: list[float] | None = None

    @property
    def turns(self) -> int:
        return len(self.turn_ends)

    @property
    def reply(self) -> str:
        """The last assistant message."""
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")

    @property
    def env_reward(self) -> float:
        """The environment's rewards summed over the episode; NaN when it gave none."""
        return sum(r for _, r in self.turn_rewards) if self.turn_rewards else math.nan


class MultiTurn:
    """The tools and environment of a run, and ``rollout``, which plays a batch of conversations."""

    def __init__(self, args, tokenizer, data_path: str = "the data"):
        self.args, self.tokenizer = args, tokenizer
        self.tools = {t.name: t for t in load_tools(args.tool)}
        self.tool_runner = ToolRunner(self.tools)  # one worker process for the run's calls, replaced after a timeout
        self.env = EnvCaller(load_env(args.env), data_path) if args.env else None
        self.splicer = Splicer(tokenizer, [t.schema for t in self.tools.values()])

    def start(self, prompt, row: int, columns: dict) -> Conversation:
        """A row's conversation before the first turn: the environment's opening (a new instance, reset with
        the prompt row), or the prompt."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        env = None
        if self.env is not None:
            env = self.env.make(row)
            opening = self.env.reset(env, row, {"prompt": prompt, **columns})
            messages = opening or messages
        return Conversation(messages, self.splicer.opening(messages), env=env, opening=len(messages))

    def rollout(
        self, model, prompts: list, rows: list[int], columns: dict[str, list], generation, device, engine=None
    ) -> list:
        """Play one conversation per prompt (``rows``: their data rows, ``columns``: the rows' other fields);
        ``engine``: a ``VLLMEngine`` that samples the replies instead of ``sample_responses``."""
        convs = [self.start(p, r, {k: v[i] for k, v in columns.items()}) for i, (p, r) in enumerate(zip(prompts, rows))]
        stops = stop_token_ids(model, self.tokenizer)
        limit = self.args.max_total_tokens or math.inf
        longest = max(len(c.prompt_ids) for c in convs)
        if longest >= limit:
            raise UserError(
                f"a conversation opens with {longest} tokens, no fewer than {option('max_total_tokens', limit)}"
            )
        for turn in range(self.args.max_turns):
            going = [i for i, c in enumerate(convs) if not c.done]
            if not going:
                break
            room = [limit - len(convs[i].prompt_ids) - len(convs[i].ids) for i in going]
            gen = replace(generation, max_new_tokens=int(min(generation.max_new_tokens, max(room))))
            contexts = [convs[i].prompt_ids + convs[i].ids for i in going]
            if engine is None:
                replies = sample_responses(model, self.tokenizer, contexts, gen, len(contexts), device)
            else:
                replies = engine.sample(model, contexts, gen)
            for k, (i, reply, space) in enumerate(zip(going, replies, room)):
                last = turn + 1 == self.args.max_turns
                reply = reply[: int(min(space, len(reply)))]
                if engine is not None:  # the engine's log-probs of the reply's tokens (``answer`` appends them)
                    convs[i].logprobs = (convs[i].logprobs or []) + engine.last_logprobs[k][: len(reply)]
                self.answer(convs[i], rows[i], reply, stops, last, limit)
        for c in convs:
            c.env = None  # environments live for one step
        return convs

    def answer(self, c: Conversation, row: int, reply: list[int], stops: list[int], last: bool, limit: float) -> None:
        """Append a reply, then the tools' or the environment's answer; mark the row done when it ends."""
        c.ids += reply
        c.actions += [1] * len(reply)
        c.turn_ends.append(len(c.ids) - 1)
        c.reply_ids = reply
        stopped = bool(reply) and reply[-1] in stops
        text = self.tokenizer.decode(reply, skip_special_tokens=True)
        # the message as a template writes it (after "Assistant:" the plain template adds the space itself)
        c.messages.append({"role": "assistant", "content": text.strip()})
        if not stopped:  # cut off at --max-new-tokens or the conversation's token limit
            c.done, c.truncated = True, True
            return
        calls = parse_tool_calls(text, self.args.tool_format) if self.tools else []
        if calls:
            if last:  # the turns ran out: a call no reply can follow is not run
                c.done, c.truncated = True, True
                return
            results = self.tool_runner.run(calls, self.args.tool_timeout)
            c.tool_calls += len(calls)
            c.tool_errors += sum(r.error for r in results)
            new = [{"role": "tool", "content": r.content} for r in results]
        elif self.env is not None:
            new, reward, done = self.env.step(c.env, row, text)
            if reward is not None:
                c.turn_rewards.append((len(c.ids) - 1, reward))
            if done or not new:
                c.done, c.finished = True, True
                return
            if last:  # the turns ran out before the episode did
                c.done, c.truncated = True, True
                return
        else:  # a final answer
            c.done, c.finished = True, True
            return
        splice = self.splicer.continuation(c.messages, new, self.tokenizer.decode([reply[-1]]))
        if len(c.prompt_ids) + len(c.ids) + len(splice) >= limit:  # no room left for another reply
            c.done, c.truncated = True, True
            return
        c.messages += new
        c.ids += splice
        c.actions += [0] * len(splice)
        if c.logprobs is not None:  # no one sampled the spliced tokens
            c.logprobs += [0.0] * len(splice)


def conversation_metrics(convs: list[Conversation]) -> dict[str, float]:
    """``rollout/turns`` (model turns per conversation), ``rollout/tool_calls`` and ``rollout/tool_errors``
    (per conversation), ``rollout/truncated`` (the share of conversations a limit ended), and
    ``rollout/tokens``: a conversation's tokens, prompt included (``response/length`` counts the policy's)."""
    n = max(len(convs), 1)
    return {
        "rollout/tokens": sum(len(c.prompt_ids) + len(c.ids) for c in convs) / n,
        "rollout/turns": sum(c.turns for c in convs) / n,
        "rollout/tool_calls": sum(c.tool_calls for c in convs) / n,
        "rollout/tool_errors": sum(c.tool_errors for c in convs) / n,
        "rollout/truncated": sum(c.truncated for c in convs) / n,
    }
