"""Signs of reward hacking in online RL: verbosity, repetition, and the proxy rising while the gold score falls.

The first rollout comes from the starting policy (= the reference), so its length and repetition are
the baseline. A warning is printed (and counted in ``monitor/warnings``) when:
- mean response length drifts beyond ``length_ratio`` x the baseline (or below 1/ratio);
- within-response bigram repetition rises more than ``repetition_delta`` above the baseline;
- the training reward (the proxy: a reward model's score, or the reward functions' total) rose while the
  gold score fell over the last ``window`` gold checks.
"""

from __future__ import annotations

from rlhfkit.data.text_stats import text_stats


class HackingMonitor:
    def __init__(self, logger, length_ratio: float = 1.5, repetition_delta: float = 0.15, window: int = 3):
        self.logger = logger
        self.length_ratio, self.repetition_delta, self.window = length_ratio, repetition_delta, window
        self.baseline: dict[str, float] | None = None
        self.proxy_since_gold: list[float] = []
        self.history: list[tuple[float, float]] = []  # (proxy, gold) at each gold check
        self.active: set[str] = set()
        self.warnings = 0

    def _warn(self, kind: str, on: bool, step: int, message: str) -> None:
        if on and kind not in self.active:
            self.warnings += 1
            self.logger.write(f"warning (step {step}): possible reward hacking: {message}")
        (self.active.add if on else self.active.discard)(kind)

    def observe(self, step: int, texts: list[str], proxy: float, gold: float | None = None) -> dict[str, float]:
        stats = text_stats(texts)
        if self.baseline is None:
            self.baseline = stats
        base = self.baseline
        ratio = stats["length"] / max(base["length"], 1e-6)
        self._warn(
            "length",
            ratio > self.length_ratio or ratio < 1 / self.length_ratio,
            step,
            f"mean response length {stats['length']:.1f} words vs {base['length']:.1f} at the start",
        )
        rep_rise = stats["repetition"] - base["repetition"]
        self._warn(
            "repetition",
            rep_rise > self.repetition_delta,
            step,
            f"repetition {stats['repetition']:.2f} vs {base['repetition']:.2f} at the start",
        )
        self.proxy_since_gold.append(proxy)
        out = {
            "monitor/length_ratio": ratio,
            "monitor/repetition": stats["repetition"],
            "monitor/distinct_2": stats["distinct_2"],
        }
        if gold is not None:
            self.history.append((sum(self.proxy_since_gold) / len(self.proxy_since_gold), gold))
            self.proxy_since_gold = []
            if len(self.history) > self.window:
                (p0, g0), (p1, g1) = self.history[-self.window - 1], self.history[-1]
                self._warn(
                    "gold",
                    p1 > p0 and g1 < g0,
                    step,
                    f"training reward rose {p0:.3f} -> {p1:.3f} while the gold score fell {g0:.3f} -> {g1:.3f}",
                )
        out["monitor/warnings"] = float(self.warnings)
        return out

    def state_dict(self) -> dict:
        return {
            "baseline": self.baseline,
            "proxy_since_gold": self.proxy_since_gold,
            "history": [list(h) for h in self.history],
            "active": sorted(self.active),
            "warnings": self.warnings,
        }

    def load_state_dict(self, state: dict) -> None:
        self.baseline = state["baseline"]
        self.proxy_since_gold = list(state["proxy_since_gold"])
        self.history = [tuple(h) for h in state["history"]]
        self.active = set(state["active"])
        self.warnings = int(state["warnings"])
