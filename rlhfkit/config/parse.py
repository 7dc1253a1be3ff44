"""Build a command's config from defaults < YAML file < command-line flags.

The flags are generated from the config dataclass: every leaf field becomes ``--name-with-dashes``
(``--name_with_underscores`` also works), its help is the field's docstring plus its default.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from rlhfkit.config.fields import choices, field_docs
from rlhfkit.config.recipes import config_file, recipe_path
from rlhfkit.errors import UserError, option
from rlhfkit.files import write_text


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One option: where it lives in the nested config and how to read it from text."""

    name: str
    path: tuple[str, ...]  # attribute path from the top config, e.g. ("optim", "learning_rate")
    type: Any
    default: Any
    doc: str
    group: str


def leaves(config: Any, prefix: tuple[str, ...] = (), group: str = "") -> list[Leaf]:
    """Flatten a config instance into its options (nested dataclass fields are parts)."""
    cls = type(config)
    hints = typing.get_type_hints(cls, include_extras=True)  # keeps Annotated[str, Choices(...)]
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out += leaves(value, prefix + (f.name,), group=f.name)
        else:
            out.append(Leaf(f.name, prefix + (f.name,), hints[f.name], value, docs.get(f.name, ""), group))
    names = [leaf.name for leaf in out]
    duplicated = {n for n in names if names.count(n) > 1}
    assert not duplicated, f"option names must be unique within a command's config: {duplicated}"
    return out


def _unwrap_optional(tp):
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _list_item_type(tp) -> type | None:
    """``str`` for ``list[str]``, ``float`` for ``list[float]``; None for other types."""
    return typing.get_args(tp)[0] if typing.get_origin(tp) is list else None


def _convert_list(item_type: type, value: Any) -> list:
    """A list option from a YAML list, a repeated flag (a list of strings), a Python list, or one string;
    numbers may be given comma-separated (``--reward-weights 1.0,0.5``). Python callables pass through as
    they are (the Python API takes reward functions as callables)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    if item_type is float:
        parts = [p for item in items for p in (item.split(",") if isinstance(item, str) else [item])]
        out = []
        for part in parts:
            if isinstance(part, bool):
                raise ValueError(f"must be numbers, got {part!r}")
            try:
                out.append(float(part))
            except (TypeError, ValueError):
                raise ValueError(f"must be numbers (comma-separated), got {part!r}") from None
        return out
    out = []
    for item in items:
        if callable(item) and not isinstance(item, str):
            out.append(item)
        elif isinstance(item, (str, int, float)) and not isinstance(item, bool) and str(item).strip():
            out.append(str(item).strip())
        else:
            raise ValueError(f"must be strings, got {item!r}")
    return out


# Other libraries' names (TRL, Hugging Face's Trainer, PEFT) for options that rlhfkit spells differently; an
# unknown option of these names is answered with rlhfkit's (when the command has it).
OTHER_SPELLINGS = {
    "lr": "learning_rate",
    "per_device_train_batch_size": "batch_size",
    "train_batch_size": "batch_size",
    "num_train_epochs": "num_epochs",
    "epochs": "num_epochs",
    "model_name_or_path": "model",
    "model_name": "model",
    "dataset": "data",
    "dataset_name": "data",
    "train_file": "data",
    "eval_dataset": "eval_data",
    "validation_file": "eval_data",
    "max_seq_length": "max_length",
    "max_completion_length": "max_new_tokens",
    "response_length": "max_new_tokens",
    "lora_rank": "lora_r",
    "use_peft": "lora_r",
    "num_iterations": "ppo_epochs",
    "epsilon": "clip_eps",
    "epsilon_high": "clip_eps_high",
    "beta": "kl_coef",
    "kl_coeff": "kl_coef",
    "reward_funcs": "reward_fn",
    "reward_model_path": "reward_model",
    "ref_model_path": "ref_model",
    "sft_model_path": "model",
    "lr_scheduler_type": "lr_scheduler",
    "resume_from_checkpoint": "resume",
    "bf16": "mixed_precision",
    "fp16": "mixed_precision",
}


def closest_option(name: str, known: list[str]) -> str | None:
    """The option of ``known`` (config field names) that an unknown ``name`` most likely meant: another
    library's spelling of it, or the nearest by spelling (a typo, a missing ``s``); None when nothing is close."""
    key = name.lstrip("-").replace("-", "_").lower()
    if OTHER_SPELLINGS.get(key) in known:
        return OTHER_SPELLINGS[key]
    if key in known:
        return key
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    if close:
        return close[0]
    # a prefix of one option only (--max-prompt for --max-prompt-length)
    longer = [k for k in known if len(key) >= 3 and k.startswith(key)]
    return longer[0] if len(longer) == 1 else None


def unknown_option(prog: str, name: str, known: list[str], where: str = "") -> UserError:
    """The error for an option ``prog`` does not have, with the one it most likely meant."""
    guess = closest_option(name, known)
    message = f"{where or prog}: unknown option {name if name.startswith('-') else repr(name)}"
    if where:  # a key of a YAML file: the key it meant
        message += f" for {prog}" + (f"; did you mean '{guess}'?" if guess else "")
    elif guess is not None:
        message += f"; did you mean {option(guess)}?"
    elif name.startswith("-"):
        message += f" (see {prog} --help)"
    return UserError(message)


def convert(leaf: Leaf, value: Any) -> Any:
    """Convert text (from a flag) or a YAML value to the option's type; raise ValueError if impossible."""
    item_type = _list_item_type(leaf.type)
    if item_type is not None:
        return _convert_list(item_type, [] if value is None else value)
    tp, optional = _unwrap_optional(leaf.type)
    if optional and (value is None or (isinstance(value, str) and value.lower() in ("none", "null", ""))):
        return None
    if value is None:
        raise ValueError("must have a value, got null")
    allowed = choices(tp)
    if allowed is not None:
        if isinstance(value, bool):  # YAML reads a bare `no` / `yes` / `off` as a boolean
            value = {False: "off" if "off" in allowed and "no" not in allowed else "no", True: "yes"}[value]
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(map(str, allowed))}, got {value!r}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"must be an integer, got {value!r}")
        try:
            return int(value) if not isinstance(value, str) else int(value, 10)
        except ValueError:
            raise ValueError(f"must be an integer, got {value!r}") from None
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"must be a number, got {value!r}") from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ValueError(f"must be a string, got {value!r}")
        if callable(value):  # a Python object given through the Python API (an environment class)
            return value
        return str(value)
    raise TypeError(f"unsupported option type {tp}")


def _set(config: Any, path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        config = getattr(config, part)
    setattr(config, path[-1], value)


def _flat_yaml(data: dict, part_names: set[str]) -> dict[str, Any]:
    """Accept flat keys (``learning_rate: 1e-5``) and keys nested under a part (``optim: {...}``)."""
    flat = {}
    for key, value in data.items():
        key = str(key).replace("-", "_")
        if key in part_names and isinstance(value, dict):
            flat.update({str(k).replace("-", "_"): v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def load_yaml(path: str) -> dict:
    """The mapping of option: value in the YAML file ``path``, or in the recipe of that name shipped with rlhfkit
    when no such file exists (``rlhfkit.config.recipes``)."""
    p = Path(config_file(path))
    if not p.is_file():
        raise UserError(f"{path}: config file does not exist (nor is it the name of a recipe)")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: a config file must be a mapping of option: value")
    return data


def load_recipe(name: str) -> dict:
    """The options of the recipe ``name`` shipped with rlhfkit (``ppo/3b-lora-1gpu``, ``demo/tiny/sft``), as
    ``{option: value}``: flat, as written, names with ``_``."""
    return {str(k).replace("-", "_"): v for k, v in load_yaml(str(recipe_path(name))).items()}


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML syntax error: where the parser found the problem (1-based line and column, as an
    editor counts them) and what the problem is. PyYAML's own message spreads this over several lines, and
    its first line ("while parsing a flow sequence") names neither the place nor the problem."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc).splitlines()[0]
    problem = " ".join(str(problem).split())
    if mark is None:
        return f"not valid YAML ({problem})"
    return f"line {mark.line + 1}, column {mark.column + 1}: not valid YAML ({problem})"


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Wraps help text without splitting words such as ``--num-epochs`` at their hyphens."""

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def build_parser(prog: str, config: Any, description: str = "") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=_HelpFormatter,
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--config",
        metavar="FILE.yaml",
        help="YAML file of options, or the name of a recipe shipped with rlhfkit (e.g. ppo/3b-lora-1gpu); flags "
        "given on the command line win.",
    )
    parser.add_argument("--debug", action="store_true", help="Show Python tracebacks for errors.")
    groups: dict[str, argparse._ArgumentGroup] = {}
    required = set(getattr(config, "REQUIRED", ()))
    positional = getattr(config, "POSITIONAL", "")  # a list option that may also be given as plain arguments
    if positional:
        parser.add_argument(
            "_" + positional,
            nargs="*",
            metavar=getattr(config, "POSITIONAL_METAVAR", positional.upper()),
            help=f"the same as --{positional}",
        )
    for leaf in leaves(config):
        title = leaf.group or "options"
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        tp, _ = _unwrap_optional(leaf.type)
        dashed, under = "--" + leaf.name.replace("_", "-"), "--" + leaf.name
        flags = [dashed] if dashed == under else [dashed, under]
        default = "required" if leaf.name in required else f"default: {leaf.default!r}"
        kwargs: dict[str, Any] = {"dest": leaf.name, "help": f"{leaf.doc} ({default})"}
        if _list_item_type(tp) is str:  # --reward-fn a.py:f b.py:g, or repeated: --reward-fn a.py:f --reward-fn b.py:g
            kwargs.update(action="extend", nargs="+", metavar="STR")
        elif _list_item_type(tp) is float:
            kwargs["metavar"] = "FLOAT,FLOAT,..."
        elif tp is bool:
            kwargs.update(nargs="?", const="true", metavar="BOOL")
        elif choices(tp) is not None:
            kwargs["metavar"] = "{" + ",".join(map(str, choices(tp))) + "}"
        else:
            kwargs["metavar"] = {int: "INT", float: "FLOAT"}.get(tp, "STR")
        groups[title].add_argument(*flags, **kwargs)
    return parser


def _description(config_cls: type, summary: str) -> str:
    """The command's summary, and the config class's own docstring (its algorithm and defaults) when it has one
    (a dataclass without one gets its signature as ``__doc__``, which is left out)."""
    doc = " ".join((config_cls.__doc__ or "").split())
    if not doc or doc.startswith(f"{config_cls.__name__}("):
        return summary
    return f"{summary}\n\n" + textwrap.fill(doc, 100, break_on_hyphens=False)


def parse_config(prog: str, config_cls: type, argv: list[str], description: str = "") -> tuple[Any, bool]:
    """Parse ``argv`` into a ``config_cls`` instance; returns (config, debug). Bad input raises UserError."""
    parser = build_parser(prog, config_cls(), _description(config_cls, description))

    def fail(message: str):  # argparse prints usage and exits 2; we want our one-line error
        raise UserError(f"{prog}: {message} (see {prog} --help)")

    parser.error = fail  # type: ignore[method-assign]
    positional = getattr(config_cls, "POSITIONAL", "")
    parse = parser.parse_known_intermixed_args if positional else parser.parse_known_args
    parsed, extra = parse(argv)
    flags = [arg for arg in extra if arg.startswith("--")]
    if extra:
        if not flags:
            fail(f"unrecognized arguments: {' '.join(extra)}")
        known = [leaf.name for leaf in leaves(config_cls())]
        raise unknown_option(prog, flags[0].split("=")[0], known)
    ns = vars(parsed)
    debug = bool(ns.pop("debug", False))
    if positional:
        given = ns.pop("_" + positional, None) or []
        if given:
            ns[positional] = ns.get(positional, []) + given
    values: dict[str, tuple[Any, str]] = {}
    if "config" in ns:
        cfg_path = ns.pop("config")
        known = {leaf.name for leaf in leaves(config_cls())}
        for key, value in _flat_yaml(load_yaml(cfg_path), part_names(config_cls())).items():
            if key not in known:
                raise unknown_option(prog, key, sorted(known), where=cfg_path)
            values[key] = (value, f"{cfg_path}: option '{key}'")
    for key, value in ns.items():
        values[key] = (value, f"{prog}: --{key.replace('_', '-')}")
    return build_config(prog, config_cls, values), debug


def part_names(config: Any) -> set[str]:
    """Names of the config's parts (its nested dataclass fields, e.g. ``optim``)."""
    return {f.name for f in dataclasses.fields(config) if dataclasses.is_dataclass(getattr(config, f.name))}


def build_config(prog: str, config_cls: type, values: dict[str, tuple[Any, str]], base: Any = None) -> Any:
    """A ``config_cls`` instance (or ``base``, updated in place) from ``{option: (value, origin)}``: every value
    converted to its option's type, required options present, the config's own checks run. ``origin`` names
    where a value came from in error messages (``"rlhfkit sft: --max-steps"``)."""
    config = config_cls() if base is None else base
    by_name = {leaf.name: leaf for leaf in leaves(config)}
    for key, (value, origin) in values.items():
        if key not in by_name:
            raise unknown_option(prog, key, list(by_name))
        leaf = by_name[key]
        try:
            _set(config, leaf.path, convert(leaf, value))
        except ValueError as exc:
            raise UserError(f"{origin} {exc}") from None
    for name in getattr(config, "REQUIRED", ()):
        leaf = by_name[name]
        if getattr(_get_part(config, leaf.path), name) in ("", None):
            raise UserError(f"{prog}: {option(name)} is required")
    check = getattr(config, "check", None)
    if check is not None:
        check()
    return config


def _get_part(config: Any, path: tuple[str, ...]) -> Any:
    for part in path[:-1]:
        config = getattr(config, part)
    return config


def flat_dict(config: Any) -> dict[str, Any]:
    """The resolved options as a flat ``{name: value}`` mapping (the format ``--config`` reads back)."""
    return {leaf.name: getattr(_get_part(config, leaf.path), leaf.name) for leaf in leaves(config)}


PYTHON_FUNCTION = "<python function "  # how config.yaml records a callable given through the Python API


def _describe(value: Any) -> Any:
    """A YAML-safe form of an option value: a Python callable (given through the Python API) by its name."""
    if isinstance(value, list):
        return [_describe(v) for v in value]
    if _is_function(value):
        return f"{PYTHON_FUNCTION}{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}>"
    return value


def _is_function(value: Any) -> bool:
    return callable(value) and not isinstance(value, str)


def described_options(config: Any) -> dict[str, Any]:
    """``flat_dict`` with Python callables (given through the Python API) named as ``config.yaml`` records them."""
    return {name: _describe(value) for name, value in flat_dict(config).items()}


def save_config(config: Any, output_dir: str | Path) -> Path:
    """``OUTPUT_DIR/config.yaml``: every option, flat, as ``--config`` reads it back. Python callables cannot be
    written as YAML; they are recorded by name, with a comment on how to give them again to replay the run."""
    path = Path(output_dir) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    options = flat_dict(config)
    flat = {name: _describe(value) for name, value in options.items()}
    given_as_callables = [
        name
        for name, value in options.items()
        if _is_function(value) or (isinstance(value, list) and any(map(_is_function, value)))
    ]
    header = "".join(
        f"# {name}: Python callables given through the Python API, recorded by name only. To replay this run,\n"
        f"# give them again: as FILE.py:NAME (--{name.replace('_', '-')} on the command line), or as callables.\n"
        for name in given_as_callables
    )
    return write_text(path, header + yaml.safe_dump(flat, sort_keys=False))
