"""Running a benchmark's pieces: a subprocess with its peak RSS and CPU time measured, the machine's CPU use by
everything else, the load while a benchmark runs, the step times a runner recorded, and ``Results``: one run of a
benchmark, merged into its result file (bench/results_file.py) after every piece."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench import results_file
from bench.stamp import Stamp, load_average

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
PYTHON = sys.executable


@dataclass
class Measured:
    returncode: int
    wall_s: float
    peak_rss_mb: float
    log: Path
    cpu_s: float = 0.0  # user + system CPU time of the child


def run_measured(cmd: list[str], log: Path, env: dict | None = None) -> Measured:
    """Run ``cmd`` with output to ``log``; its peak RSS and CPU time come from ``os.wait4`` (this child only)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu_s = usage.ru_utime + usage.ru_stime
    return Measured(proc.returncode, time.perf_counter() - t0, usage.ru_maxrss / 1024, log, cpu_s)


def check(m: Measured, what: str) -> None:
    if m.returncode != 0:
        tail = "\n".join(m.log.read_text(errors="replace").splitlines()[-25:])
        raise SystemExit(f"bench: {what} failed (exit {m.returncode}); log {m.log}:\n{tail}")


def rlhfkit_cmd(*args: str) -> list[str]:
    return [PYTHON, "-m", "rlhfkit.cli.main", *args]


def flags(options: dict) -> list[str]:
    """Options as a command's flags: ``{"max_steps": 4, "precompute_ref": True}`` -> ``--max-steps 4
    --precompute-ref true``."""
    out = []
    for name, value in options.items():
        out += [f"--{name.replace('_', '-')}", str(value).lower() if isinstance(value, bool) else str(value)]
    return out


class LoadSampler(threading.Thread):
    """Samples the 1-minute load average every ``every`` seconds while the benchmark runs."""

    def __init__(self, every: float = 10.0):
        super().__init__(daemon=True)
        self.every, self.samples = every, []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict:
        xs = self.samples or [os.getloadavg()[0]]
        return {
            "mean": round(statistics.mean(xs), 2),
            "max": round(max(xs), 2),
            "min": round(min(xs), 2),
            "samples": len(xs),
        }


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Results(dict):
    """One run of a benchmark: the stamp, the arguments and settings, the machine, ``sizes`` (filled by the
    runs) and the load while it ran. ``save`` merges it into the benchmark's file (bench/results_file.py) under
    its machine and run key after every run, so an interrupted benchmark keeps what it measured and the file's
    other runs stay; ``close`` stops the load sampler and writes the load after the runs.

    ``benchmark``: the file's benchmark name; ``defaults``: the script's option defaults (the run key names the
    options that differ from them)."""

    def __init__(self, path: Path, stamp: Stamp, benchmark: str, defaults: dict, **fields):
        super().__init__(
            stamp=stamp.record(),
            **fields,
            load_before=load_average(),
            machine={
                "cpus": os.cpu_count(),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "python": platform.python_version(),
            },
            sizes={},
        )
        self.path, self.stamp, self.benchmark = path, stamp, benchmark
        self.machine_key = results_file.machine_key(self["stamp"])
        self.run_key = results_file.run_key(self["stamp"]["commit"], self.get("args", {}), defaults)
        self.sampler = LoadSampler()
        self.sampler.start()

    def save(self) -> None:
        self["stamp"] = self.stamp.record()
        self["load_during"] = self.sampler.summary()
        results_file.merge(self.path, self.benchmark, self.machine_key, self.run_key, self)

    def close(self) -> None:
        self.sampler.stopped.set()
        self["load_after"] = load_average()
        self.save()

    def where(self) -> str:
        return f"{self.path}, machine {self.machine_key!r}, run {self.run_key!r}"


def machine_busy_s() -> float | None:
    """CPU seconds spent so far by every process on the machine (``/proc/stat``: all but idle and iowait);
    the difference over a run, less the run's own ``cpu_s``, is what other work took meanwhile."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def measured(cmd: list[str], log_file: Path, env: dict | None = None) -> tuple[Measured, float | None]:
    """``run_measured`` and the cores that other work kept busy meanwhile (machine CPU time less the run's)."""
    busy0 = machine_busy_s()
    m = run_measured(cmd, log_file, env=env)
    busy1 = machine_busy_s()
    others = None if busy0 is None or busy1 is None else round((busy1 - busy0 - m.cpu_s) / m.wall_s, 2)
    return m, others


def busy_cores(seconds: float = 5.0) -> float | None:
    """Cores busy on average over the next ``seconds`` (everything running now, as a load-average-like number
    that our own finished runs do not inflate, unlike the 1-minute load average)."""
    start = machine_busy_s()
    time.sleep(seconds)
    end = machine_busy_s()
    return None if start is None or end is None else round((end - start) / seconds, 2)


def rss_comparable(imp: dict) -> str | None:
    """A warning when ``import torch`` costs the two environments different RSS (``torch_rlhfkit`` and
    ``torch_trl`` in ``imp``, peak RSS in MB of a process that only imports torch; see ppo_vs_trl.import_rss)."""
    a, b = imp.get("torch_rlhfkit"), imp.get("torch_trl")
    if a is None or b is None or abs(a - b) <= 10:
        return None
    return (
        f"warning: `import torch` alone takes {a:.0f} MB in rlhfkit's environment and {b:.0f} MB in TRL's; peak RSS "
        "is not comparable (file pages of a just-written environment). Drop the page cache "
        "(`sync; echo 3 > /proc/sys/vm/drop_caches` as root) or reuse older environments, and run again."
    )


def step_stats(result: dict) -> dict:
    """Median step time and tokens/s over steps 2..N (the first, warm-up step is excluded)."""
    ends = result["step_ends"]
    dts = [b - a for a, b in zip(ends, ends[1:])]
    toks = result["generated_tokens"][1 : len(ends)]
    return {
        "step_s": statistics.median(dts),
        "tokens_per_s": statistics.median(t / d for t, d in zip(toks, dts)),
        "step_s_all": dts,
        "first_step_s": ends[0],
        "tokens_per_step": statistics.mean(toks),
    }
