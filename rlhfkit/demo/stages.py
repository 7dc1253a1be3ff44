"""What every demo shares: its stages run in order with their times (one may run beside the others in a child
process), the first stages (the task's data and a small model with its tokenizer), and a stage's command run on a
config built from the stage's options, as `rlhfkit COMMAND` would build it from flags (so each stage's
``config.yaml`` can be replayed with ``rlhfkit COMMAND --config``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from tqdm.auto import tqdm

from rlhfkit.commands import COMMANDS, execute
from rlhfkit.config.commands import DemoConfig
from rlhfkit.config.parse import build_config, flat_dict
from rlhfkit.demo.plan import chat_rows
from rlhfkit.errors import UserError, option
from rlhfkit.files import write_json, write_text

console = Console(stderr=True)

STAGES_FILE = "stages.json"  # the finished stages, what --resume keeps


def code_version() -> str:
    """The code a stage runs: rlhfkit's version, and where the package is a source checkout under git its commit
    (``-dirty`` when the package's files differ from it). An installed package has no commit, even inside some
    other git work tree."""
    try:
        version = f"rlhfkit {metadata.version('rlhfkit')}"
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        version = "rlhfkit (not installed)"
    here = Path(__file__).resolve().parent.parent
    if not (here.parent / "pyproject.toml").is_file():
        return version
    git = ["git", "-C", str(here)]
    try:
        sha = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return version
        status = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return version
    dirty = "-dirty" if status.stdout.strip() else ""
    return f"{version}, git {sha.stdout.strip()}{dirty}"


def stage_config(command: str, options: dict[str, Any]):
    """The config of ``rlhfkit COMMAND`` with ``options`` ({option name: value}, as the flags would give them):
    every value converted to its option's type, required options present, the command's own checks run."""
    prog = f"rlhfkit demo ({command})"
    values = {name: (value, f"{prog}: {option(name)}") for name, value in options.items()}
    return build_config(prog, COMMANDS[command].config, values)


def run_stage(command: str, options: dict[str, Any]):
    """Run ``rlhfkit COMMAND`` on ``options`` in this process; returns what the command returns."""
    return execute(command, stage_config(command, options))


class Background:
    """A stage running as ``rlhfkit COMMAND --config LOG.yaml`` in a child process (``config`` written there). Its
    ``log`` starts with that command line,
    then everything the child prints (its progress bar, warnings, an error). A watcher thread notes the wall time
    (``seconds``) and the load average (``load``) the moment the child exits, then calls ``on_exit(self)``;
    ``beside`` collects the stages run meanwhile."""

    def __init__(self, name: str, command: str, config, log: Path, threads: int, on_exit):
        self.name, self.log = name, log
        self.beside: list[str] = []
        self.seconds: float | None = None  # the child's wall time
        self.done_before = 0.0  # the seconds an earlier run spent on the part of this stage the child continues
        self.load = float("nan")
        log.parent.mkdir(parents=True, exist_ok=True)
        options = write_text(log.with_suffix(".yaml"), yaml.safe_dump(flat_dict(config), sort_keys=False))
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        start = time.perf_counter()
        with open(log, "w") as f:
            f.write(f"rlhfkit {command} --config {options}\n")
            f.flush()  # before the child writes to the same file
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rlhfkit.cli.main", command, "--config", str(options)],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.watcher = threading.Thread(target=self._watch, args=(start, on_exit), daemon=True)
        self.watcher.start()

    def _watch(self, start: float, on_exit) -> None:
        self.process.wait()
        self.seconds = time.perf_counter() - start
        self.load = _load_average()
        on_exit(self)


def _load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


class Stages:
    """Runs the stages in order, printing which one is running and how long each took. ``load`` keeps the
    machine's 1-minute load average at the end of each stage: other work on the machine stretches the times.
    A stage can also run beside the others in a child process (``start`` ... ``wait``); its end is printed the
    moment the child exits, among the stages running then, and ``beside`` names the stages that ran meanwhile.
    ``seconds`` and ``load`` list the stages in the order they started; ``code`` the code each ran
    (``code_version``: a stage kept from an earlier run keeps that run's)."""

    def __init__(self, total: int, record: Path | None = None, identity: dict | None = None, resume: bool = False):
        self.total, self.done, self.seconds, self.load = total, 0, {}, {}
        self.code: dict[str, str | None] = {}
        self.current = code_version()
        self.beside: dict[str, str] = {}
        self.pending: list[Background] = []
        self.order: list[str] = []
        # ``record`` (stages.json) lists the finished stages with their times, under the run's ``identity`` (task,
        # seed, model, ...). With ``resume`` the stages an earlier run of the same demo finished are kept.
        self.record, self.identity = record, identity or {}
        self.earlier: dict[str, dict] = {}
        self.earlier_seconds = 0.0
        if record is not None and resume and record.is_file():
            saved = json.loads(record.read_text())
            if saved.get("identity") != self.identity:
                raise UserError(
                    f"demo: {record.parent} holds a demo run with other settings ({saved.get('identity')}); "
                    f"{option('resume', True)} continues only the same run: give a new {option('output_dir')}"
                )
            self.earlier = saved.get("stages", {})

    def kept(self, name: str) -> bool:
        """Whether an earlier run finished stage ``name`` (then it is shown as kept, with that run's time)."""
        if name not in self.earlier:
            return False
        self._header(name)
        seconds = self.earlier[name]["seconds"]
        self.earlier_seconds += seconds
        self._record(name, seconds, self.earlier[name]["load"], self.earlier[name].get("code"))
        console.print(f"[green]kept[/green] {escape(name)}: finished by an earlier run (in {seconds:.0f}s)")
        return True

    def _header(self, name: str) -> None:
        self.done += 1
        self.order.append(name)
        console.rule(f"[bold]demo {self.done}/{self.total}: {escape(name)}")

    def _record(self, name: str, seconds: float, load: float, code: str | None = "") -> None:
        """``code``: the code that ran the stage ("": this run's; None: not known, a record older than this)."""
        self.seconds[name], self.load[name] = seconds, load
        self.code[name] = self.current if code == "" else code
        self.seconds = {n: self.seconds[n] for n in self.order if n in self.seconds}
        self.load = {n: self.load[n] for n in self.order if n in self.load}
        self.code = {n: self.code[n] for n in self.order if n in self.code}
        if self.record is not None:
            stages = {n: {"seconds": self.seconds[n], "load": self.load[n], "code": self.code[n]} for n in self.seconds}
            write_json(self.record, {"identity": self.identity, "stages": stages})

    def start(
        self, name: str, command: str, config, log: Path, threads: int, done_before: float = 0.0
    ) -> Background | None:
        """None: an earlier run finished this stage (``kept``). ``done_before``: as for ``run``."""
        if self.kept(name):
            return None
        log = log.resolve()
        self._header(name)
        console.print(f"in a child process beside the next stages; its log: {escape(str(log))}", soft_wrap=True)
        job = Background(name, command, config, log, threads, on_exit=self._exited)
        job.done_before = done_before
        self.pending.append(job)
        return job

    @staticmethod
    def _exited(job: Background) -> None:
        """Runs on the child's watcher thread as it exits, clearing any progress bar while it prints."""
        with tqdm.external_write_mode(file=sys.stderr):
            if job.process.returncode == 0:
                console.print(f"[green]done[/green] {escape(job.name)} in {job.seconds:.0f}s")
            else:
                console.print(
                    f"[red]failed[/red] {escape(job.name)} (exit {job.process.returncode}); its log: "
                    f"{escape(str(job.log))}",
                    soft_wrap=True,
                )

    def wait(self, job: Background) -> None:
        """Wait for a stage started with ``start``; a failed one stops the demo with the end of its log."""
        if job.watcher.is_alive():
            console.print(f"waiting for {escape(job.name)} ...")
        job.watcher.join()
        self.pending.remove(job)
        if job.process.returncode != 0:
            tail = "\n".join(job.log.read_text(errors="replace").splitlines()[-15:])
            raise UserError(f"demo: {job.name} failed (exit {job.process.returncode}); end of {job.log}:\n{tail}")
        self._record(job.name, job.seconds + job.done_before, job.load)
        self.earlier_seconds += job.done_before
        self.beside[job.name] = ", ".join(job.beside)

    def run(self, name: str, fn, keep: bool = True, done_before: float = 0.0):
        """Run stage ``name`` (``fn()``) and return its result; one an earlier run finished is kept instead
        (None) unless ``keep`` is False (a stage whose result the next ones need). ``done_before``: the seconds an
        earlier run spent on the part of this stage that ``fn`` continues (counted in the stage's time)."""
        if keep and self.kept(name):
            return None
        for job in self.pending:
            if job.seconds is None:  # still running
                job.beside.append(name)
        self._header(name)
        start = time.perf_counter()
        result = fn()
        self._record(name, time.perf_counter() - start + done_before, _load_average())
        self.earlier_seconds += done_before
        earlier = f" ({done_before:.0f}s of it by an earlier run)" if done_before else ""
        console.print(f"[green]done[/green] {escape(name)} in {self.seconds[name]:.0f}s{earlier}")
        return result


def announce_report(out: Path) -> None:
    """A demo's last lines: where its summary and its report are, the report last."""
    console.print(f"\nsummary: {escape(str((out / 'summary.json').resolve()))}", soft_wrap=True)
    console.print(f"[bold]report:[/bold] {escape(str((out / 'report.md').resolve()))}", soft_wrap=True)


def begin(
    cfg: DemoConfig, write_task_data, total: int, sizes: dict[str, int] | None = None
) -> tuple[Path, dict[str, str], Stages]:
    """The stages every demo starts with: the task's data files (``sizes`` overrides the task's default row
    counts) and a small model with a tokenizer trained on the task's corpus, or, with ``--model``, the task's data
    in the chat form of that model (``plan.chat_rows``). Returns (output dir, {data file name: path}, the stage
    runner)."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = cfg.model
    identity = {
        k: getattr(cfg, k) for k in ("task", "seed", "model", "quick", "arch", "size", "kl_ablation", "gold_reward")
    }
    stages = Stages(total=total, record=out / STAGES_FILE, identity=identity, resume=cfg.resume)

    def task_data():
        files = write_task_data(out / "data", seed=cfg.seed, sizes=sizes)
        return chat_rows(files, model, out / "data" / "chat") if model else files

    data = {k: str(v) for k, v in stages.run("task data", task_data, keep=False).items()}
    if not model:
        base = {"corpus": data["corpus"], "output_dir": f"{out}/base", "arch": cfg.arch, "size": cfg.size}
        stages.run("init-model", lambda: run_stage("init-model", {**base, "seed": cfg.seed}))
    return out, data, stages
