"""The Python API: every command as a function, for notebooks and scripts.

Each function takes the command's options as keyword arguments, spelled as the command-line flags in
snake_case (``output_dir``, ``max_steps``, ``kl_coef``), with the same defaults, the same validation and the
same errors (raised as ``UserError`` instead of printed, naming options as keywords: ``max_steps must be > 0``
where the command line says ``--max-steps must be > 0``) — the options are one definition, the config
dataclasses in ``rlhfkit.config``. A ready config instance may be passed instead, as the first argument,
optionally with keyword overrides.

A call is as quiet as the command line: transformers' warnings and progress bars are silenced while it runs,
and the caller's transformers logging settings are restored when it returns. What the command reports (a
round's accuracy, the files written) goes to the ``rlhfkit`` logger; where the program has not set up logging
itself, a call shows those messages at INFO on stderr, as the command line does, and nothing below INFO.

``data`` and ``eval_data`` may be a path or a list of dicts in the data formats the commands read. In-memory
rows are written to ``OUTPUT_DIR/inputs/<option>.jsonl`` first (for ``generate``, ``score`` and ``evaluate``,
to an ``inputs`` folder beside ``output``), so the run's ``config.yaml`` names real files and the run can be
repeated from the command line.

    import rlhfkit

    result = rlhfkit.sft(model="base", data=[{"prompt": "Hi", "completion": " Hello!"}] * 64,
                         output_dir="out/sft", max_steps=50, learning_rate=1e-3)
    result.output_dir   # Path("out/sft"): the model in Hugging Face format, metrics.jsonl, ...
    result.metrics      # the last logged metrics, e.g. {"loss": ..., "learning_rate": ...}
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rlhfkit.commands import COMMANDS, execute, launched_world, messages_shown
from rlhfkit.config.parse import build_config, flat_dict
from rlhfkit.errors import UserError, spelling
from rlhfkit.files import write_text
from rlhfkit.training.session import check_output_dir

IN_MEMORY_OPTIONS = ("data", "eval_data")  # options that may be given as a list of dicts


@dataclass
class Result:
    """What a command produced.

    output_dir: the directory written (a training command's model, metrics and checkpoints; for
        ``generate``, ``score`` and ``evaluate`` the folder of ``output``)
    metrics: the last logged metrics of a training run, or the measurements of ``evaluate`` / ``demo``
    output: the file written by ``generate``, ``score`` or ``evaluate`` (None for the others)
    """

    output_dir: Path
    metrics: dict[str, Any] = field(default_factory=dict)
    output: Path | None = None


def _write_rows(rows: list, path: Path, option: str) -> str:
    if not all(isinstance(row, dict) for row in rows):
        raise UserError(f"{option}: a list given as data must hold dicts (one per row)")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{option}: rows must be JSON-serialisable ({exc})") from None
    return str(write_text(path, text))


def _materialise(options: dict[str, Any], inputs_dir: Path | None) -> dict[str, Any]:
    """Replace in-memory rows by the path of a JSONL file written into ``inputs_dir``; paths become strings."""
    out = {k: str(v) if isinstance(v, Path) else v for k, v in options.items()}
    for name in IN_MEMORY_OPTIONS:
        value = out.get(name)
        if isinstance(value, (list, tuple)):
            if inputs_dir is None:
                raise UserError(f"{name}: in-memory rows need output_dir (or output) to be written beside the run")
            out[name] = _write_rows(list(value), inputs_dir / f"{name}.jsonl", name)
    return out


def _inputs_dir(resolved: dict[str, Any]) -> Path | None:
    """Where in-memory rows go: OUTPUT_DIR/inputs, or for a command writing one file, FILE's folder/inputs."""
    if resolved.get("output_dir"):
        return Path(resolved["output_dir"]) / "inputs"
    if resolved.get("output"):
        return Path(resolved["output"]).parent / "inputs"
    return None


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers at error level with its progress bars off (the "Loading weights" bars, the load report of
    a new reward head, warnings about attention masks), as the command line runs it; the caller's level and
    progress-bar settings (transformers' and huggingface_hub's) are put back afterwards."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.get_verbosity()  # sets up transformers' logger first, so the level read next is the one in use
    logger = logging.getLogger("transformers")
    level, bars, hub_bars = logger.level, hf_logging.is_progress_bar_enabled(), not are_progress_bars_disabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            hf_logging.enable_progress_bar()
        if hub_bars:
            enable_progress_bars()
        else:
            disable_progress_bars()


def _run(command: str, config: Any = None, /, **options: Any) -> tuple[Any, dict[str, Any]]:
    """Build the config of ``command`` from ``config`` and/or keyword options and run it, quietly and with
    errors naming options as keywords; returns what the command returned and the resolved options (flat, by
    name)."""
    with spelling("keyword"), _quiet_transformers(), messages_shown(unless_configured=True):
        return _build_and_execute(command, config, **options)


def _build_and_execute(command: str, config: Any = None, /, **options: Any) -> tuple[Any, dict[str, Any]]:
    spec = COMMANDS[command]
    prog = f"rlhfkit.{command.replace('-', '_')}"
    if config is not None and not isinstance(config, spec.config):
        raise TypeError(f"{prog}: expected a {spec.config.__name__}, got {type(config).__name__}")
    base = dataclasses.replace(config) if config is not None else None  # the caller's object stays as it was
    if base is not None:  # nested parts are copied too, so overrides never reach the caller's config
        for f in dataclasses.fields(base):
            part = getattr(base, f.name)
            if dataclasses.is_dataclass(part):
                setattr(base, f.name, dataclasses.replace(part))
    given = flat_dict(base) if base is not None else {}
    inputs_dir = _inputs_dir({**given, **{k: v for k, v in options.items() if k in ("output_dir", "output")}})
    _check_output_dir(spec.config, {**given, **options})  # before in-memory rows are written into it
    if base is not None:  # in-memory rows set on a config object
        in_memory = {k: v for k, v in given.items() if k in IN_MEMORY_OPTIONS and isinstance(v, (list, tuple))}
        for name, value in _materialise(in_memory, inputs_dir).items():
            options.setdefault(name, value)
    options = _materialise(options, inputs_dir)
    values = {key: (value, f"{prog}: {key}") for key, value in options.items()}
    resolved = build_config(prog, spec.config, values, base)
    return execute(command, resolved), flat_dict(resolved)


def _check_output_dir(config_cls: type, options: dict[str, Any]) -> None:
    """Stop before writing in-memory rows into ``output_dir`` when it holds another run (as the command would)."""
    # under a launcher the processes check together when the session opens (one may already have written)
    if not hasattr(config_cls(), "run") or not options.get("output_dir") or launched_world() > 1:
        return
    run = SimpleNamespace(
        output_dir=str(options["output_dir"]),
        resume=bool(options.get("resume")),
        overwrite_output_dir=bool(options.get("overwrite_output_dir")),
    )
    check_output_dir(run)


def _train(command: str, config: Any, options: dict[str, Any]) -> Result:
    metrics, resolved = _run(command, config, **options)
    return Result(Path(resolved["output_dir"]), dict(metrics or {}))


def _write(command: str, config: Any, options: dict[str, Any]) -> Result:
    _, resolved = _run(command, config, **options)
    output = Path(resolved["output"])
    return Result(output.parent, output=output)


def sft(config=None, /, **options: Any) -> Result:
    """Supervised fine-tuning (``rlhfkit sft``): ``model``, ``data``, ``output_dir`` required; every option of
    ``rlhfkit sft --help`` as a keyword (e.g. ``max_steps``, ``learning_rate``, ``batch_size``, ``lora_r``)."""
    return _train("sft", config, options)


def rm(config=None, /, **options: Any) -> Result:
    """A Bradley–Terry reward model (``rlhfkit rm``): ``model``, ``data`` (preference pairs), ``output_dir``
    required; e.g. ``ensemble``, ``center_coef``, ``max_steps``."""
    return _train("rm", config, options)


def ppo(config=None, /, **options: Any) -> Result:
    """PPO against a reward model with a KL penalty (``rlhfkit ppo``): ``model``, ``reward_model`` (or
    ``reward_fns``), ``data`` (prompts), ``output_dir`` required; e.g. ``kl_coef``, ``target_kl``,
    ``max_new_tokens``, ``lora_r``."""
    return _train("ppo", config, _reward_aliases(options))


def grpo(config=None, /, **options: Any) -> Result:
    """GRPO (``rlhfkit grpo``): ``model``, ``data`` (prompt rows; their other columns reach the reward
    functions), ``output_dir`` required, and rewards: ``reward_fns=[f, g]`` (Python callables with TRL's
    signature, or ``"FILE.py:NAME"`` strings), ``reward_weights=[1.0, 0.5]``, and/or ``reward_model``."""
    return _train("grpo", config, _reward_aliases(options))


def rloo(config=None, /, **options: Any) -> Result:
    """RLOO (``rlhfkit rloo``): as ``grpo``, with the leave-one-out baseline."""
    return _train("rloo", config, _reward_aliases(options))


def _reward_aliases(options: dict[str, Any]) -> dict[str, Any]:
    """``reward_fns`` and ``tools`` are the Python spellings of the repeatable ``--reward-fn`` and ``--tool``;
    one callable may stand alone. ``env`` takes the environment class itself."""
    out = dict(options)
    if "reward_fns" in out:
        if "reward_fn" in out:
            raise UserError("give reward_fns or reward_fn, not both")
        out["reward_fn"] = out.pop("reward_fns")
    if callable(out.get("reward_fn")):
        out["reward_fn"] = [out["reward_fn"]]
    if "tools" in out:  # the Python spelling of the repeatable --tool
        if "tool" in out:
            raise UserError("give tools or tool, not both")
        out["tool"] = out.pop("tools")
    if callable(out.get("tool")):
        out["tool"] = [out["tool"]]
    return out


def dpo(config=None, /, **options: Any) -> Result:
    """Direct preference optimisation (``rlhfkit dpo``): ``model``, ``data`` (preference pairs), ``output_dir``
    required; e.g. ``beta``, ``loss_type``, ``label_smoothing``."""
    return _train("dpo", config, options)


def merge(config=None, /, **options: Any) -> Result:
    """A LoRA adapter merged into its base model (``rlhfkit merge``): ``adapter`` (e.g. a run's ``output_dir``
    written with ``save_merged=False``) and ``output_dir`` required; ``model`` the base when the adapter's
    config does not name one that exists here."""
    _, resolved = _run("merge", config, **options)
    return Result(Path(resolved["output_dir"]))


def iterate(config=None, /, **options: Any) -> Result:
    """Iterated RLHF (``rlhfkit iterate``): ``model`` (the SFT model), ``data`` (prompts), ``output_dir``,
    ``judge`` (``"FILE.py:NAME"``, a function, ``"human"`` or a task's raters, ``"support"``) and
    ``reward_model`` or ``prefs`` required; e.g. ``rounds``, ``pairs_per_round``, ``rm_steps``, ``max_steps``
    (PPO steps per round) and every option of ``ppo``. ``metrics`` is the run's summary (per round: labels, the
    old reward model's accuracy on the new pairs, reward, KL, gold)."""
    summary, resolved = _run("iterate", config, **options)
    return Result(Path(resolved["output_dir"]), dict(summary))


def judge(config=None, /, **options: Any) -> Result:
    """A local model labels pairs (``rlhfkit judge``): ``model`` (the judge), ``data`` (pairs), ``output_dir``
    required; e.g. ``principles``, ``reference``, ``min_confidence``. ``output`` is ``prefs.jsonl``, ``metrics``
    the report (pairs, ties, order consistency, mean confidence; with ``reference`` the agreement with people)."""
    report, resolved = _run("judge", config, **options)
    out = Path(resolved["output_dir"])
    return Result(out, dict(report), out / "prefs.jsonl")


def revise(config=None, /, **options: Any) -> Result:
    """Constitutional AI's critique-and-revise stage (``rlhfkit revise``): ``model``, ``data`` (prompts),
    ``output_dir`` required; e.g. ``principles``, ``max_new_tokens``. ``output`` is ``sft.jsonl``, ``metrics`` the
    report."""
    report, resolved = _run("revise", config, **options)
    out = Path(resolved["output_dir"])
    return Result(out, dict(report), out / "sft.jsonl")


def init_model(config=None, /, **options: Any) -> Result:
    """A small random causal LM and a BPE tokenizer trained on ``corpus`` (``rlhfkit init-model``)."""
    _, resolved = _run("init-model", config, **options)
    return Result(Path(resolved["output_dir"]))


def generate(config=None, /, **options: Any) -> Result:
    """Sample responses for prompt rows into the JSONL file ``output`` (``rlhfkit generate``)."""
    return _write("generate", config, options)


def score(config=None, /, **options: Any) -> Result:
    """Reward-model scores of prompt/response rows into the JSONL file ``output`` (``rlhfkit score``)."""
    return _write("score", config, options)


def evaluate(config=None, /, **options: Any) -> Result:
    """Sample a policy on prompts and measure the replies into the JSON file ``output`` (``rlhfkit eval``)."""
    metrics, resolved = _run("eval", config, **options)
    output = Path(resolved["output"])
    return Result(output.parent, dict(metrics), output)


def label(config=None, /, **options: Any) -> Result:
    """The preference-labelling page (``rlhfkit label``): ``output_dir`` required, ``data`` (candidates) the
    first time. Serves until interrupted; with ``export=True`` it writes ``prefs.jsonl``, ``ties.jsonl`` and
    ``agreement.json`` into ``output_dir`` instead and returns at once (``output`` is ``prefs.jsonl``,
    ``metrics`` the agreement report)."""
    paths, resolved = _run("label", config, **options)
    out = Path(resolved["output_dir"])
    if not paths:
        return Result(out)
    return Result(out, json.loads(paths["agreement.json"].read_text(encoding="utf-8")), paths["prefs.jsonl"])


def view(config=None, /, **options: Any) -> Result:
    """The page of training runs (``rlhfkit view``): ``runs`` a list of run folders. Serves until interrupted."""
    if isinstance(options.get("runs"), (str, Path)):
        options["runs"] = [options["runs"]]
    if "runs" in options:
        options["runs"] = [str(r) for r in options["runs"]]
    _, resolved = _run("view", config, **options)
    return Result(Path(resolved["runs"][0]))


def demo(config=None, /, **options: Any) -> Result:
    """The built-in task end to end with a report (``rlhfkit demo``); ``metrics`` is its summary."""
    summary, resolved = _run("demo", config, **options)
    return Result(Path(resolved["output_dir"]), dict(summary))
