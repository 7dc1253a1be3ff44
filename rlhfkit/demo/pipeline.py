"""`rlhfkit demo`: init-model -> SFT -> reward model -> PPO (KL on) -> PPO (beta = 0) -> DPO -> evaluation.

(``--task arithmetic`` runs ``rlhfkit.demo.arithmetic`` instead: SFT -> GRPO on a checkable reward.)

Every stage runs the same code as its CLI command (configs built from flags, so each stage's
``config.yaml`` can be replayed with ``rlhfkit COMMAND --config``). The gold judge of the task is used
only to evaluate, never to train. With a core to spare, the beta = 0 stage runs in a child process beside
PPO and DPO (it needs only the SFT and reward models).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from tqdm.auto import tqdm

from rlhfkit.config.commands import DemoConfig
from rlhfkit.errors import UserError

console = Console(stderr=True)

# Stage settings for the ~0.23M-parameter GPT-2 on 2 CPU cores (measurements in docs/demo.md, "Why these
# settings"). SFT runs long because copying the customer's product from the prompt into the reply is learnt
# late: after 1000 steps the model names a random product, after 3000 the right one. PPO's value function
# starts from the reward model, as in InstructGPT (Ouyang et al. 2022): a value head on the tiny policy
# explained almost none of the returns' variance, and the noisy advantages held PPO back.
SETTINGS = {
    "sft": (
        "--max-steps 3000 --learning-rate 3e-3 --batch-size 16 --warmup-steps 20 --lr-scheduler cosine "
        "--eval-steps 1000"
    ),
    "rm": "--max-steps 800 --learning-rate 5e-4 --batch-size 32 --max-grad-norm 10 --eval-steps 400",
    "ppo": (
        "--max-steps 60 --learning-rate 2e-4 --batch-size 32 --num-minibatches 2 --ppo-epochs 4 "
        "--max-new-tokens 40 --temperature 0.7 --kl-coef 0.1 --gold-steps 10 --sample-steps 10"
    ),
    "dpo": "--max-steps 400 --learning-rate 3e-4 --batch-size 16 --beta 0.1 --precompute-ref --eval-steps 200",
}
# The beta = 0 ablation runs longer than PPO with the penalty: over-optimisation takes more steps to show than
# the penalised run takes to level off, and the learning rate decays linearly to 0 over --max-steps, so a 60-step
# run without the penalty slows down just as its gold score turns. Over 100 steps its logged gold peaks early and
# then falls below the penalised run's in every seed measured (docs/demo.md).
NO_KL_STEPS = {"full": 100, "quick": 2}
# Rows of task data: more than the task's defaults, so the 3000 SFT steps see each demonstration ~6 times
# rather than 24 (less overfitting) and the reward model sees each pair about three times; 2000 held-out pairs
# measure its accuracy (and the label-noise ceiling) to about +-0.01.
SIZES = {"sft": 8000, "prefs_train": 8000, "prefs_eval": 2000}
QUICK = {  # a smoke test of the wiring: seconds, numbers meaningless
    "sft": "--max-steps 4 --batch-size 8",
    "rm": "--max-steps 4 --batch-size 8",
    "ppo": "--max-steps 2 --batch-size 8 --max-new-tokens 8 --gold-steps 1",
    "dpo": "--max-steps 4 --batch-size 8",
}
EVAL_GENERATION = {"max_new_tokens": 40, "temperature": 0.7}  # as the PPO rollouts sample
# Samples per held-out prompt in the final evaluation: with one, a policy's mean gold score moves by about
# ±0.2 with the sampling seed alone (100 prompts); four halve that, for ~6 s more.
EVAL_SAMPLES_PER_PROMPT = 4


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

    def __init__(self, total: int):
        self.total, self.done, self.seconds, self.load = total, 0, {}, {}
        self.beside: dict[str, str] = {}
        self.pending: list[Background] = []
        self.order: list[str] = []

    def _header(self, name: str) -> None:
        self.done += 1
        self.order.append(name)
        console.rule(f"[bold]demo {self.done}/{self.total}: {escape(name)}")

    def _record(self, name: str, seconds: float, load: float) -> None:
        self.seconds[name], self.load[name] = seconds, load
        self.seconds = {n: self.seconds[n] for n in self.order if n in self.seconds}
        self.load = {n: self.load[n] for n in self.order if n in self.load}

    def start(self, name: str, command: str, argv: str, log: Path, threads: int) -> Background:
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

    def run(self, name: str, fn):
        for job in self.pending:
            if job.seconds is None:  # still running
                job.beside.append(name)
        self._header(name)
        start = time.perf_counter()
        result = fn()
        self._record(name, time.perf_counter() - start, _load_average())
        console.print(f"[green]done[/green] {escape(name)} in {self.seconds[name]:.0f}s")
        return result


def announce_report(out: Path) -> None:
    """A demo's last lines: where its summary and its report are, the report last."""
    console.print(f"\nsummary: {escape(str((out / 'summary.json').resolve()))}", soft_wrap=True)
    console.print(f"[bold]report:[/bold] {escape(str((out / 'report.md').resolve()))}", soft_wrap=True)


def begin(
    cfg: DemoConfig, write_task_data, total: int, sizes: dict[str, int] | None = None
) -> tuple[Path, dict[str, str], Stages]:
    """The stages every demo starts with: the task's data files (``sizes`` overrides the task's default row
    counts) and a small model with a tokenizer trained on the task's corpus. Returns (output dir, {data file
    name: path}, the stage runner)."""
    import torch

    torch.set_num_threads(cfg.threads)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stages = Stages(total=total)
    files = stages.run("task data", lambda: write_task_data(out / "data", seed=cfg.seed, sizes=sizes))
    data = {k: str(v) for k, v in files.items()}
    stages.run(
        "init-model",
        lambda: _run(
            "init-model",
            f"--corpus {data['corpus']} --output-dir {out}/base --arch {cfg.arch} --size {cfg.size} --seed {cfg.seed}",
        ),
    )
    return out, data, stages


def run(cfg: DemoConfig) -> dict:
    if cfg.task == "arithmetic":
        from rlhfkit.demo import arithmetic

        return arithmetic.run(cfg)
    from rlhfkit.config.parts import GenerationArgs
    from rlhfkit.demo.report import write_report
    from rlhfkit.inference.evaluate import evaluate_policy
    from rlhfkit.tasks import get_judge
    from rlhfkit.tasks.support import label_noise_ceiling, product_naming_shares, write_task_data

    settings = QUICK if cfg.quick else SETTINGS
    start = time.perf_counter()
    out, data, stages = begin(cfg, write_task_data, total=8, sizes=None if cfg.quick else SIZES)
    common = f"--seed {cfg.seed} --progress {str(cfg.progress).lower()}"
    stages.run(
        "SFT",
        lambda: _run(
            "sft",
            f"--model {out}/base --data {data['sft']} --eval-data {data['sft_eval']} "
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
    ppo = (
        f"--model {out}/sft --reward-model {out}/rm --value-model {out}/rm --data {data['prompts_train']} "
        f"--eval-data {data['prompts_eval']} --gold-judge support {settings['ppo']} {common}"
    )
    no_kl_name = "PPO without KL (beta = 0)"
    no_kl = (
        f"{ppo} --output-dir {out}/ppo_no_kl --kl-coef 0 --log-ref-kl true "
        f"--max-steps {NO_KL_STEPS['quick' if cfg.quick else 'full']}"
    )
    # The ablation needs only the SFT and reward models, so with a core to spare it runs beside PPO and DPO
    # (each stage on cfg.threads threads; a seed gives the same numbers either way).
    job = None
    if 2 * cfg.threads <= (os.cpu_count() or 1):
        # The log is the only place the child's progress shows, so it draws its bar there whatever --progress says.
        no_kl = no_kl.replace("--progress false", "--progress true")
        job = stages.start(no_kl_name, "ppo", no_kl, out / "ppo_no_kl.log", cfg.threads)
    try:
        stages.run("PPO (KL penalty on)", lambda: _run("ppo", f"{ppo} --output-dir {out}/ppo"))
        if job is None:
            stages.run(no_kl_name, lambda: _run("ppo", no_kl))
        stages.run(
            "DPO",
            lambda: _run(
                "dpo",
                f"--model {out}/sft --data {data['prefs_train']} --eval-data {data['prefs_eval']} "
                f"--output-dir {out}/dpo {settings['dpo']} {common}",
            ),
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
        prompts = prompts * (1 if cfg.quick else EVAL_SAMPLES_PER_PROMPT)  # the list repeated: samples 0..99 differ
        gen = GenerationArgs(**EVAL_GENERATION) if not cfg.quick else GenerationArgs(max_new_tokens=8)
        results = {}
        for name in ("sft", "ppo", "ppo_no_kl", "dpo"):
            metrics, rows = evaluate_policy(
                str(out / name),
                prompts,
                gen,
                reward_model=str(out / "rm"),
                reference=str(out / "sft"),
                judge=get_judge("support"),
                seed=cfg.seed,
            )
            metrics.update(product_naming_shares([r["prompt"] for r in rows], [r["response"] for r in rows]))
            results[name] = {"metrics": metrics, "samples": rows}
        return results

    results = stages.run("evaluation on held-out prompts", evaluate_all)
    prefs_eval = [json.loads(line) for line in open(data["prefs_eval"])]
    ceiling = label_noise_ceiling(prefs_eval)
    summary = write_report(out, results, ceiling, stages, time.perf_counter() - start, cfg.quick)
    announce_report(out)
    return summary
