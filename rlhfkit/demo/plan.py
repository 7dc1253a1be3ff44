"""What the support demo runs: the stages' options and the data sizes, for the built-in tiny model or for a
pretrained model given with ``--model`` (a Hugging Face folder or a ``.gguf`` file), read from the demo's recipes
(``rlhfkit/recipes/demo/PLAN/``: a file of options per stage, which ``rlhfkit COMMAND --config`` reads too, and
``plan.yaml`` with the demo's own numbers).

The built-in model's plan is ``demo/tiny``. Above ``LORA_ABOVE`` parameters a pretrained model gets
``demo/smollm2-135m-lora``, where every stage trains LoRA adapters (the PPO and DPO reference is then the same
backbone with its adapters off; the reward model's new score head trains in full), and PPO's advantages are
leave-one-out (several replies a prompt, no value model); a smaller one gets the built-in model's. ``--quick`` runs
``demo/quick``, with the pretrained plan's LoRA options on a pretrained model. Where a plan's advantage estimator
needs a critic, PPO's value function is a network started from the reward model (with adapters on its backbone when
the policy has them). Plain PPO and iterated PPO share the estimator, so the two differ only in their labels'
timing. The pretrained model's own chat template formats every prompt (``chat_rows``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlhfkit.config.parse import load_recipe
from rlhfkit.config.recipes import DEMO_STAGES, PLAN_FILE, recipe_path
from rlhfkit.data.templates import has_chat_template
from rlhfkit.errors import UserError
from rlhfkit.files import write_jsonl
from rlhfkit.models.loading import check_model_dir, load_tokenizer
from rlhfkit.ops.estimators import get_advantage_estimator
from rlhfkit.tasks.support.prompts import customer_message

LORA_ABOVE = 50_000_000  # parameters
TINY_RECIPE, PRETRAINED_RECIPE, QUICK_RECIPE = "demo/tiny", "demo/smollm2-135m-lora", "demo/quick"
# what plan.yaml holds: {key: (type, required)}
PLAN_KEYS = {
    "sizes": (dict, True),
    "no_kl_steps": (int, True),
    "eval_samples": (int, True),
    "pairs_per_round": (int, False),
    "pretrained_sizes": (dict, False),
}


def stage_settings(recipe: str) -> dict[str, dict]:
    """{stage: its options} of the demo plan ``recipe`` (``demo/tiny``), in the order the stages run."""
    return {stage: load_recipe(f"{recipe}/{stage}") for stage in DEMO_STAGES}


def plan_numbers(recipe: str) -> dict:
    """The demo's own numbers of plan ``recipe``: its ``plan.yaml``, each key checked."""
    path = recipe_path(f"{recipe}/{PLAN_FILE}")
    numbers = load_recipe(f"{recipe}/{PLAN_FILE}")
    for key, value in numbers.items():
        if key not in PLAN_KEYS:
            raise UserError(f"{path}: unknown key '{key}' (a demo plan has {', '.join(PLAN_KEYS)})")
        kind = PLAN_KEYS[key][0]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise UserError(f"{path}: '{key}' must be {'a mapping' if kind is dict else 'an integer'}, got {value!r}")
    missing = [k for k, (_, required) in PLAN_KEYS.items() if required and k not in numbers]
    if missing:
        raise UserError(f"{path}: missing {', '.join(missing)}")
    return numbers


TINY = stage_settings(TINY_RECIPE)
PRETRAINED = stage_settings(PRETRAINED_RECIPE)
QUICK = stage_settings(QUICK_RECIPE)  # a smoke test of the wiring: seconds, numbers meaningless
LORA = {k: PRETRAINED["sft"][k] for k in ("lora_r", "lora_alpha")}
# A pretrained model's LoRA stages save their adapters alone, on the model each started from; every command loads
# such a folder as its merged model.
ADAPTERS = dict(**LORA, save_merged=PRETRAINED["sft"]["save_merged"])


@dataclass
class Plan:
    """One demo run's choices. ``settings``: options per stage (by name); ``sizes``: task rows (None: the task's
    defaults); ``no_kl_steps``: the beta = 0 ablation's steps; ``eval_samples``: samples per held-out prompt;
    ``parameters``: the model's parameter count (0 for the built-in one, made by the demo); ``parameter_bytes``:
    the bytes a parameter takes in its saved weights;
    ``pairs_per_round``: iterated PPO's pairs per round (None: half the preference labels spread over its
    rounds, the other half offline)."""

    settings: dict[str, dict]
    sizes: dict[str, int] | None
    no_kl_steps: int
    eval_samples: int
    parameters: int = 0
    parameter_bytes: int = 4
    notes: list[str] = field(default_factory=list)
    pairs_per_round: int | None = None

    @property
    def value_model(self) -> bool:
        """PPO's value function starts from the reward model: its advantage estimator needs a critic (else PPO
        runs without one)."""
        return needs_critic(self.settings["ppo"])


def needs_critic(options: dict) -> bool:
    """Whether a stage's PPO options (``ppo``, ``iterate``) name an advantage estimator that learns a value function
    (none named: PPO's default, GAE)."""
    return get_advantage_estimator(options.get("advantage", "gae")).needs_critic


def plan(quick: bool, model: str = "") -> Plan:
    """The stages' settings for the built-in model (``model`` empty) or a pretrained one, from the demo's
    recipes."""
    parameters, parameter_bytes = model_size(model) if model else (0, 4)
    pretrained = parameters > LORA_ABOVE
    if quick:
        numbers = plan_numbers(QUICK_RECIPE)
        settings = {k: {**v, **ADAPTERS} if pretrained else v for k, v in QUICK.items()}
        if pretrained:
            settings["iterate"]["rm_lora_r"] = LORA["lora_r"]
        sizes = numbers["pretrained_sizes"] if pretrained else numbers["sizes"]
        return _plan(settings, numbers, sizes, parameters, parameter_bytes)
    if pretrained:
        numbers = plan_numbers(PRETRAINED_RECIPE)
        notes = [
            f"{parameters / 1e6:.0f}M parameters: LoRA (r = {LORA['lora_r']}) on every stage, reward and value "
            "models too"
        ]
        return _plan(PRETRAINED, numbers, numbers["sizes"], parameters, parameter_bytes, notes)
    numbers = plan_numbers(TINY_RECIPE)
    return _plan(TINY, numbers, numbers["sizes"], parameters, parameter_bytes)


def _plan(settings: dict, numbers: dict, sizes: dict, parameters: int, parameter_bytes: int, notes=None) -> Plan:
    return Plan(
        settings,
        sizes,
        numbers["no_kl_steps"],
        numbers["eval_samples"],
        parameters=parameters,
        parameter_bytes=parameter_bytes,
        notes=notes or [],
        pairs_per_round=numbers.get("pairs_per_round"),
    )


def model_size(model: str) -> tuple[int, int]:
    """(parameters, bytes a parameter takes in the saved weights) of the causal LM at ``model`` (a folder or a
    ``.gguf`` file), from its config alone: the parameters counted on PyTorch's meta device (no weights are
    read), the bytes from the config's dtype (2 for bfloat16 or float16; 4 when it names none or float32, and
    a ``.gguf`` file is de-quantised to float32)."""
    config = AutoConfig.from_pretrained(check_model_dir(model, "model"), local_files_only=True)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    size = dtype.itemsize if isinstance(dtype, torch.dtype) and dtype.is_floating_point else 4
    return sum(p.numel() for p in lm.parameters()), size


def chat_rows(files: dict[str, Path], model: str, out: Path) -> dict[str, Path]:
    """The task's files with every prompt as a chat (one user message: the customer's words) and every reply as
    an assistant message, when the model's tokenizer has a chat template; else the files as they are. The gold
    judge reads the customer's message from either form."""
    if not has_chat_template(load_tokenizer(model)):
        return files
    out.mkdir(parents=True, exist_ok=True)
    converted = {}
    for name, path in files.items():
        if path.suffix != ".jsonl":
            converted[name] = path
            continue
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        for row in rows:
            row["prompt"] = [{"role": "user", "content": customer_message(row["prompt"])}]
            for key in ("completion", "chosen", "rejected"):
                if key in row:
                    row[key] = [{"role": "assistant", "content": row[key].strip()}]
        converted[name] = write_jsonl(out / path.name, rows)
    return converted
