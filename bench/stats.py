"""The statistics of bench/: every benchmark and every docs table computes its means, standard errors, paired
differences, t-tests and sign counts here. Standard library only.

Conventions: ``None`` values are left out (a run that did not record a number); a single value has a spread of 0
(the tables print it as such), no values give NaN.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable


def _values(xs: Iterable[float | None]) -> list[float]:
    return [x for x in xs if x is not None]


def mean_std(xs: Iterable[float | None]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1)."""
    v = _values(xs)
    if not v:
        return math.nan, math.nan
    return statistics.mean(v), (statistics.stdev(v) if len(v) > 1 else 0.0)


def mean_se(xs: Iterable[float | None]) -> tuple[float, float]:
    """Mean and its standard error, s / sqrt(n)."""
    v = _values(xs)
    mean, std = mean_std(v)
    return mean, (std / math.sqrt(len(v)) if len(v) > 1 else std)


def diff_se(a: Iterable[float], b: Iterable[float]) -> tuple[float, float]:
    """Difference of two means and its standard error, for independent samples: sqrt(se_a^2 + se_b^2)."""
    (ma, sa), (mb, sb) = mean_se(a), mean_se(b)
    return ma - mb, math.hypot(sa, sb)


def differences(a: Iterable[float], b: Iterable[float]) -> list[float]:
    """a_i - b_i for paired samples (the same seed, prompt or reply in both); unequal lengths are an error."""
    return [x - y for x, y in zip(a, b, strict=True)]


def paired(a: Iterable[float], b: Iterable[float]) -> tuple[float, float]:
    """Mean of the paired differences a_i - b_i and its standard error."""
    return mean_se(differences(a, b))


def t_test_p(diffs: Iterable[float]) -> float | None:
    """Two-sided p of a one-sample t-test of mean 0 (Student's t with n - 1 degrees of freedom, its density
    integrated by Simpson's rule); for paired samples, pass their ``differences``. None for fewer than 2 values or
    none that differ."""
    v = _values(diffs)
    n = len(v)
    if n < 2 or statistics.stdev(v) == 0:
        return None
    t = abs(statistics.mean(v)) / (statistics.stdev(v) / math.sqrt(n))
    df = n - 1
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    steps = 20000
    h = t / steps
    density = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
    inner = h / 3 * (density[0] + density[-1] + 4 * sum(density[1:-1:2]) + 2 * sum(density[2:-1:2]))
    return max(0.0, 1 - 2 * inner)


def wins(diffs: Iterable[float]) -> int:
    """The sign count: how many differences are above 0."""
    return sum(d > 0 for d in _values(diffs))


def pm(ms: tuple[float, float], digits: int = 2, sign: str = "") -> str:
    """A (mean, spread) pair as printed: "1.23 ± 0.04"; ``sign="+"`` writes the mean's sign always."""
    return f"{ms[0]:{sign}.{digits}f} ± {ms[1]:.{digits}f}"
