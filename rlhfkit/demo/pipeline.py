"""`rlhfkit demo`: init-model -> SFT -> reward model -> PPO (KL on) -> PPO (beta = 0) -> DPO -> iterated PPO ->
evaluation.

(``--task arithmetic`` runs ``rlhfkit.demo.arithmetic`` instead: SFT -> GRPO on a checkable reward; ``--task tools``
runs ``rlhfkit.demo.tools``: SFT -> GRPO with a tool the policy learns to call.)

Every stage runs the same code as its CLI command (configs built from flags, so each stage's
``config.yaml`` can be replayed with ``rlhfkit COMMAND --config``). The gold judge of the task is used
only to evaluate, never to train. With a core to spare, the beta = 0 stage runs in a child process beside
PPO and DPO (it needs only the SFT and reward models).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from tqdm.auto import tqdm

from rlhfkit.config.commands import DemoConfig
from rlhfkit.demo.plan import Plan, chat_rows, plan
from rlhfkit.errors import UserError, option

console = Console(stderr=True)

EVAL_GENERATION = {"max_new_tokens": 40, "temperature": 0.7}  # as the PPO rollouts sample
STAGES_FILE = "stages.json"  # the finished stages, what --resume keeps


def _run(command: str, argv: str):
    """Parse flags exactly as the CLI does and run the command."""
    from rlhfkit.cli.main import run_command

    return run_command(command, argv.split())


class Background:
    """A stage running as ``rlhfkit COMMAND ...`` in a child process. Its ``log`` starts with that command line,
    then everything the child prints (its progress bar, warnings, an error). A watcher thread notes the wall time
    (``seconds``) and the load average (``load``) the moment the child exits, then calls ``on_exit(self)``;
    ``beside`` collects the stages run meanwhile."""

    def __init__(self, name: str, command: str, argv: str, log: Path, threads: int, on_exit):
        self.name, self.log = name, log
        self.beside: list[str] = []
        self.seconds: float | None = None
        self.load = float("nan")
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        start = time.perf_counter()
        with open(log, "w") as f:
            f.write(f"rlhfkit {command} {argv}\n")
            f.flush()  # before the child writes to the same file
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rlhfkit.cli.main", command, *argv.split()],
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
    ``seconds`` and ``load`` list the stages in the order they started."""

    def __init__(self, total: int, record: Path | None = None, identity: dict | None = None, resume: bool = False):
        self.total, self.done, self.seconds, self.load = total, 0, {}, {}
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
        self._record(name, seconds, self.earlier[name]["load"])
        console.print(f"[green]kept[/green] {escape(name)}: finished by an earlier run (in {seconds:.0f}s)")
        return True

    def _header(self, name: str) -> None:
        self.done += 1
        self.order.append(name)
        console.rule(f"[bold]demo {self.done}/{self.total}: {escape(name)}")

    def _record(self, name: str, seconds: float, load: float) -> None:
        self.seconds[name], self.load[name] = seconds, load
        self.seconds = {n: self.seconds[n] for n in self.order if n in self.seconds}
        self.load = {n: self.load[n] for n in self.order if n in self.load}
        if self.record is not None:
            stages = {n: {"seconds": self.seconds[n], "load": self.load[n]} for n in self.seconds}
            tmp = self.record.with_name(self.record.name + ".tmp")
            tmp.write_text(json.dumps({"identity": self.identity, "stages": stages}, indent=2) + "\n")
            tmp.replace(self.record)

    def start(self, name: str, command: str, argv: str, log: Path, threads: int) -> Background | None:
        """None: an earlier run finished this stage (``kept``)."""
        if self.kept(name):
            return None
        log = log.resolve()
        self._header(name)
        console.print(f"in a child process beside the next stages; its log: {escape(str(log))}", soft_wrap=True)
        job = Background(name, command, argv, log, threads, on_exit=self._exited)
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
        self._record(job.name, job.seconds, job.load)
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
    identity = {k: getattr(cfg, k) for k in ("task", "seed", "model", "quick", "arch", "size", "kl_ablation")}
    stages = Stages(total=total, record=out / STAGES_FILE, identity=identity, resume=cfg.resume)

    def task_data():
        files = write_task_data(out / "data", seed=cfg.seed, sizes=sizes)
        return chat_rows(files, model, out / "data" / "chat") if model else files

    data = {k: str(v) for k, v in stages.run("task data", task_data, keep=False).items()}
    if not model:
        stages.run(
            "init-model",
            lambda: _run(
                "init-model",
                f"--corpus {data['corpus']} --output-dir {out}/base --arch {cfg.arch} --size {cfg.size} "
                f"--seed {cfg.seed}",
            ),
        )
    return out, data, stages


def iterated_seconds_done(out: Path) -> float:
    """The seconds an earlier run of iterated PPO spent on its finished rounds and its first reward model (what
    ``rlhfkit iterate --resume`` keeps of it)."""
    path = out / "iterated" / "summary.json"
    return json.loads(path.read_text(encoding="utf-8"))["totals"]["seconds"] if path.is_file() else 0.0


def _rounds(iterate_flags: str) -> int:
    """The rounds of iterated PPO in its stage's flags (``--rounds N``)."""
    return int(iterate_flags.split("--rounds ")[1].split()[0])


def run_iterated(out: Path, data: dict[str, str], flags: str, run_plan, common: str, resume: bool = False) -> dict:
    """Iterated PPO on the same number of preference labels as the reward model and DPO: the first half of the
    offline pairs trains its first reward model, and the task's simulated raters (``--judge support``, the rule
    that labelled those pairs) label the policy's own pairs for the other half, spread over the rounds."""
    rows = Path(data["prefs_train"]).read_text(encoding="utf-8").splitlines(keepends=True)
    half = len(rows) // 2
    offline = out / "data" / "prefs_half.jsonl"
    offline.write_text("".join(rows[:half]), encoding="utf-8")
    rounds = _rounds(flags)
    per_round = run_plan.pairs_per_round or max(1, (len(rows) - half) // rounds)
    return _run(
        "iterate",
        f"--model {out}/sft --prefs {offline} --data {data['prompts_train']} --eval-data {data['prompts_eval']} "
        f"--judge support --gold-judge support --pairs-per-round {per_round} --output-dir {out}/iterated "
        f"{flags} {common.replace('--overwrite-output-dir', '--resume') if resume else common}",
    )


def disk_needed(run_plan: Plan, ablation: bool) -> int:
    """Bytes a demo on a given model writes, roughly: every saved model is a full copy in the model's dtype: SFT,
    the reward model, PPO, DPO, the beta = 0 run when it runs, and iterated PPO's first reward model, its final
    policy and each round's reward model, policy and value model. 0 for the built-in model."""
    copies = 4 + ablation + 2 + 3 * _rounds(run_plan.settings["iterate"])
    return run_plan.parameter_bytes * run_plan.parameters * copies


def _bytes_in(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def check_disk(out: Path, needed: int) -> None:
    """Stop before the first stage when the disk holding ``out`` has less free space than the run still has to
    write (``needed`` less what an earlier run left there), rather than hours later in a checkpoint save."""
    if not needed:
        return
    where = next(p for p in (out, *out.parents) if p.exists())
    free = shutil.disk_usage(where).free
    remaining = needed - _bytes_in(out)
    if free < remaining:
        gb = 1024**3
        raise UserError(
            f"demo: {where} has {free / gb:.1f} GiB free; this run writes about {remaining / gb:.1f} GiB more "
            f"(every model it trains is saved in full). Free some space or choose another {option('output_dir')}."
        )


def run(cfg: DemoConfig) -> dict:
    if cfg.task in ("arithmetic", "tools"):
        from rlhfkit.demo import arithmetic, tools

        if cfg.model:
            raise UserError(f"demo: {option('model')} runs the support task; the {cfg.task} task trains its own model")

        return {"arithmetic": arithmetic, "tools": tools}[cfg.task].run(cfg)
    from rlhfkit.config.parts import GenerationArgs
    from rlhfkit.demo.report import write_report
    from rlhfkit.inference.evaluate import evaluate_policy
    from rlhfkit.tasks import get_judge
    from rlhfkit.tasks.support import label_noise_ceiling, product_naming_shares, write_task_data

    start = time.perf_counter()
    run_plan = plan(cfg.quick, cfg.model)
    settings = run_plan.settings
    # The beta = 0 run shows what the KL penalty is for; on a pretrained model it is one more PPO run, so it runs
    # there only when asked.
    ablation = cfg.kl_ablation if cfg.kl_ablation is not None else not cfg.model
    total = (8 if cfg.model else 9) - (not ablation)
    check_disk(Path(cfg.output_dir), disk_needed(run_plan, ablation))
    out, data, stages = begin(cfg, write_task_data, total=total, sizes=run_plan.sizes)
    base = cfg.model or f"{out}/base"
    common = f"--seed {cfg.seed} --progress {str(cfg.progress).lower()} --overwrite-output-dir"
    stages.run(
        "SFT",
        lambda: _run(
            "sft",
            f"--model {base} --data {data['sft']} --eval-data {data['sft_eval']} "
            f"--output-dir {out}/sft {settings['sft']} {common}",
        ),
    )
    stages.run(
        "reward model",
        lambda: _run(
            "rm",
            f"--model {out}/sft --data {data['prefs_train']} "
            f"--eval-data {data['prefs_eval']} --output-dir {out}/rm {settings['rm']} {common}",
        ),
    )
    value = f"--value-model {out}/rm " if run_plan.value_model else ""
    ppo = (
        f"--model {out}/sft --reward-model {out}/rm {value}--data {data['prompts_train']} "
        f"--eval-data {data['prompts_eval']} --gold-judge support {settings['ppo']} {common}"
    )
    no_kl_name = "PPO without KL (beta = 0)"
    no_kl = f"{ppo} --output-dir {out}/ppo_no_kl --kl-coef 0 --log-ref-kl true --max-steps {run_plan.no_kl_steps}"
    # The ablation needs only the SFT and reward models, so with a core to spare it runs beside PPO and DPO
    # (each stage on cfg.threads threads; a seed gives the same numbers either way).
    job = None
    if ablation and cfg.threads and 2 * cfg.threads <= (os.cpu_count() or 1):
        # The log is the only place the child's progress shows, so it draws its bar there whatever --progress says.
        no_kl = no_kl.replace("--progress false", "--progress true")
        job = stages.start(no_kl_name, "ppo", no_kl, out / "ppo_no_kl.log", cfg.threads)
    try:
        stages.run("PPO (KL penalty on)", lambda: _run("ppo", f"{ppo} --output-dir {out}/ppo"))
        if ablation and job is None and no_kl_name not in stages.seconds:  # not started beside, nor kept
            stages.run(no_kl_name, lambda: _run("ppo", no_kl))
        stages.run(
            "DPO",
            lambda: _run(
                "dpo",
                f"--model {out}/sft --data {data['prefs_train']} --eval-data {data['prefs_eval']} "
                f"--output-dir {out}/dpo {settings['dpo']} {common}",
            ),
        )
        stages.run(
            "iterated PPO",
            lambda: run_iterated(out, data, settings["iterate"], run_plan, common, cfg.resume),
            done_before=iterated_seconds_done(out) if cfg.resume else 0.0,
        )
    except BaseException:
        if job is not None:
            job.process.kill()
        raise
    if job is not None:
        stages.wait(job)

    def evaluate_all():
        from rlhfkit.data.schema import load_examples

        prompts = [ex.prompt for ex in load_examples(data["prompts_eval"], "prompt", "rlhfkit demo")]
        prompts = prompts * run_plan.eval_samples  # the list repeated: samples 0..99 differ
        gen = GenerationArgs(**EVAL_GENERATION) if not cfg.quick else GenerationArgs(max_new_tokens=8)
        results = {}
        policies = {name: out / name for name in ("sft", "ppo", "ppo_no_kl", "dpo") if ablation or name != "ppo_no_kl"}
        policies["iterated"] = out / "iterated" / "final"
        for name, policy in policies.items():
            metrics, rows = evaluate_policy(
                str(policy),
                prompts,
                gen,
                reward_model=str(out / "rm"),
                reference=str(out / "sft") if name != "sft" else "",  # the SFT model's KL to itself is 0
                judge=get_judge("support"),
                seed=cfg.seed,
            )
            metrics.update(product_naming_shares([r["prompt"] for r in rows], [r["response"] for r in rows]))
            results[name] = {"metrics": metrics, "samples": rows}
        return results

    results = stages.run("evaluation on held-out prompts", evaluate_all, keep=False)
    prefs_eval = [json.loads(line) for line in open(data["prefs_eval"])]
    ceiling = label_noise_ceiling(prefs_eval)
    summary = write_report(
        out,
        results,
        ceiling,
        stages,
        time.perf_counter() - start + stages.earlier_seconds,
        cfg.quick,
        run_plan,
        cfg.model,
        cfg.seed,
    )
    announce_report(out)
    return summary
