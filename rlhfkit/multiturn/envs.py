"""Environments: a class the rollout plays several turns against (a game, a grader, a simulated user).

    class Guess:
        def reset(self, row: dict) -> str | list[dict] | None: ...   # the opening message(s); None: the row's prompt
        def step(self, reply: str) -> tuple[str | list[dict] | None, float | None, bool]: ...
            # (the next user message(s) or None, a reward for this turn or None, whether the episode is over)

One instance per rollout row (``reset`` gets the prompt row: ``prompt`` and its other columns), created at the
start of a step and dropped at its end, so no environment state outlives a step: a checkpoint, written between
steps, never has any to hold, and a resumed run replays the same episodes. An environment that needs randomness
should draw it from the row (e.g. a ``seed`` column), which keeps its episodes reproducible. Its rewards join
the run's other rewards as ``env`` (their sum over the episode; each turn's at that turn's last token where the
advantage estimator works per token). A method that raises stops the run with one line naming the environment
and the data row.
"""

from __future__ import annotations

from pathlib import Path

from rlhfkit.data.readers import row_location
from rlhfkit.errors import UserError, option
from rlhfkit.userfiles import load_object, split_spec


def load_env(spec) -> type:
    """The environment class of ``--env`` (``FILE.py:NAME``, or the class itself through the Python API)."""
    if isinstance(spec, str):
        path, name = split_spec("env", spec)
        cls = load_object("env", spec, Path(path), name, what="class")
    else:
        cls = spec
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise UserError(f"{option('env')}: {getattr(cls, '__name__', cls)} has no {' or '.join(missing)} method")
    return cls


def as_messages(value, role: str = "user", what: str = "") -> list[dict]:
    """An environment's message(s): a string is one message of ``role``; a list of ``{"role", "content"}``
    dicts is taken as it is; None or "" is none."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    ):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise ValueError(f"{what} returned {type(value).__name__}, not a string or a list of {{role, content}} messages")


class EnvCaller:
    """Calls one environment class's methods for the rows of a batch, turning a failure into one line."""

    def __init__(self, cls: type, data_path: str):
        self.cls, self.data_path = cls, data_path
        self.name = getattr(cls, "__name__", type(cls).__name__)

    def fail(self, row: int, what: str, exc: Exception) -> UserError:
        detail = str(exc).splitlines()[0] if str(exc) else ""
        return UserError(
            f"{row_location(self.data_path, row)}: environment {self.name}.{what} raised {type(exc).__name__}"
            + (f": {detail}" if detail else "")
        )

    def make(self, row: int):
        try:
            return self.cls()
        except Exception as exc:
            raise self.fail(row, "__init__", exc) from None

    def reset(self, env, row: int, data: dict) -> list[dict]:
        try:
            return as_messages(env.reset(data), what=f"{self.name}.reset")
        except Exception as exc:
            raise self.fail(row, "reset", exc) from None

    def step(self, env, row: int, reply: str) -> tuple[list[dict], float | None, bool]:
        try:
            out = env.step(reply)
            if not isinstance(out, tuple) or len(out) != 3:
                raise ValueError(f"{self.name}.step returned {out!r}, not (message, reward, done)")
            message, reward, done = out
            if reward is not None:
                reward = float(reward)
                if reward != reward or reward in (float("inf"), float("-inf")):
                    raise ValueError(f"{self.name}.step returned the reward {reward}")
            return as_messages(message, what=f"{self.name}.step"), reward, bool(done)
        except Exception as exc:
            raise self.fail(row, "step", exc) from None
