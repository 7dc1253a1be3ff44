"""What the support demo runs: the stages' flags and the data sizes, for the built-in tiny model or for a
pretrained model given with ``--model`` (a Hugging Face folder or a ``.gguf`` file).

The built-in model is a ~0.23M-parameter GPT-2 trained from scratch, so its stages are long and cheap. A
pretrained model already writes fluent replies: its stages are short, and each step costs ~100x more. Above
``LORA_ABOVE`` parameters every stage trains LoRA adapters (the PPO and DPO reference is then the same backbone
with its adapters off; the reward model's and the value model's new score heads train in full). On every model
PPO's value function is a network started from the reward model (with adapters on its backbone when the policy
has them), in plain PPO as in iterated PPO, so the two differ only in their labels' timing.
The pretrained model's own chat template formats every prompt (``chat_rows``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlhfkit.data.templates import has_chat_template
from rlhfkit.files import write_jsonl
from rlhfkit.models.loading import check_model_dir, load_tokenizer
from rlhfkit.tasks.support.prompts import customer_message

LORA_ABOVE = 50_000_000  # parameters

TINY = {
    # The built-in model on 2 CPU cores (the runs behind these choices: docs/demo.md, "Why these settings"). SFT
    # runs long because copying the customer's product from the prompt into the reply is learnt late. PPO's value
    # function starts from the reward model, as in InstructGPT (Ouyang et al. 2022): a value head on the tiny
    # policy explains too little of the returns' variance, and the noisy advantages hold PPO back.
    "sft": dict(
        max_steps=3000, learning_rate=3e-3, batch_size=16, warmup_steps=20, lr_scheduler="cosine", eval_steps=1000
    ),
    "rm": dict(max_steps=800, learning_rate=5e-4, batch_size=32, max_grad_norm=10, eval_steps=400),
    "ppo": dict(
        max_steps=60,
        learning_rate=2e-4,
        batch_size=32,
        num_minibatches=2,
        ppo_epochs=4,
        max_new_tokens=40,
        temperature=0.7,
        kl_coef=0.1,
        gold_steps=10,
        sample_steps=10,
    ),
    # DPO makes one pass over all the preference labels (8000 pairs, 500 steps of 16). Its beta is the one whose
    # policy ranks the held-out pairs best, as the raters labelled them (bench/dpo_beta.py over 0.03-10 on two
    # seeds; never the gold judge).
    "dpo": dict(max_steps=500, learning_rate=3e-4, batch_size=16, beta=3.0, precompute_ref=True, eval_steps=250),
    # Iterated PPO at the same number of labels: its first reward model learns from half the offline pairs (400
    # steps: as many passes over them as the offline reward model makes over all), then each of 3 rounds has the
    # simulated raters label the policy's own pairs (the other half of the labels, a third a round), the reward
    # model continues on every pair so far, and PPO continues for a third of PPO's steps, with PPO's settings.
    "iterate": dict(
        rounds=3,
        max_steps=20,
        rm_initial_steps=400,
        rm_steps=200,
        rm_learning_rate=5e-4,
        rm_batch_size=32,
        learning_rate=2e-4,
        batch_size=32,
        num_minibatches=2,
        ppo_epochs=4,
        max_new_tokens=40,
        temperature=0.7,
        kl_coef=0.1,
        gold_steps=20,
    ),
    # Online DPO, iterated PPO's control at the same labels: DPO on the same half of the offline pairs, then each
    # round DPO continues on the raters' labels of the policy's own pairs (one pass, at DPO's rate and beta).
    "online_dpo": dict(rounds=3, dpo_epochs=1.0, dpo_beta=3.0, learning_rate=3e-4, max_new_tokens=40, temperature=0.7),
}
LORA = dict(lora_r=16, lora_alpha=32)
# A pretrained model's LoRA stages save their adapters alone, each on the model it started from (SFT's on the
# given model, PPO's, DPO's and the reward model's on SFT's, a round's on the last round's): a few megabytes each
# where a merged model is the whole model's size. Every command loads such a folder as its merged model.
ADAPTERS = dict(**LORA, save_merged=False)
RM_LORA_RATE = 1e-3  # bench/rm_lora.py: the highest held-out accuracy of 5e-4 and 1e-3, above training in full
PRETRAINED = {
    # A pretrained chat model of ~100M+ parameters on 2 CPU cores (times on SmolLM2-135M in docs/demo-models.md),
    # sized so that a seed runs in under an hour: 600 preference labels, 16 PPO steps. Every stage trains LoRA
    # adapters (the reward model's and the value model's score head in full) and saves them alone; the reward
    # model's rate: bench/rm_lora.py (held-out accuracy and time against training it in full). The reward model's
    # held-out evaluation runs once, at its last step (its accuracy is in the report); DPO and PPO evaluate on no
    # held-out data (--eval-steps -1: the demo's evaluation measures every final policy), and PPO's gold score is
    # logged at its first and last step, for the report's curves. PPO makes two epochs of two
    # minibatches over each batch of rollouts: a single update per batch is cheaper a step, but in this budget
    # of steps it leaves the gold score where SFT left it.
    "sft": dict(max_steps=80, learning_rate=2e-4, batch_size=8, warmup_steps=8, eval_steps=80, **ADAPTERS),
    # one pass over the 600 preference labels (75 steps of 8), as DPO makes
    "rm": dict(max_steps=75, learning_rate=RM_LORA_RATE, batch_size=8, eval_steps=75, **ADAPTERS),
    "ppo": dict(
        max_steps=16,
        learning_rate=1e-4,
        batch_size=16,
        num_minibatches=2,
        ppo_epochs=2,
        max_new_tokens=40,
        temperature=0.7,
        kl_coef=0.05,
        gold_steps=16,
        sample_steps=8,
        eval_steps=-1,
        **ADAPTERS,
    ),
    "dpo": dict(
        max_steps=75, learning_rate=5e-5, batch_size=8, beta=0.1, precompute_ref=True, eval_steps=-1, **ADAPTERS
    ),
    # Iterated PPO as on the built-in model, in 2 rounds: the first reward model makes one pass over half the
    # offline pairs, each round adds half of the other half (the policy's own pairs) and continues the reward
    # model for 40 steps over every pair so far, and PPO continues for half of PPO's steps with PPO's settings.
    # Its value model is a separate network started from the reward model (adapters on its backbone too), as
    # plain PPO's. The policy's adapter goes on training from round to round (the reference is SFT: its adapters
    # off).
    "iterate": dict(
        rounds=2,
        max_steps=8,
        rm_initial_steps=38,
        rm_steps=40,
        rm_learning_rate=RM_LORA_RATE,
        rm_lora_r=LORA["lora_r"],
        rm_batch_size=8,
        learning_rate=1e-4,
        batch_size=16,
        num_minibatches=2,
        ppo_epochs=2,
        max_new_tokens=40,
        temperature=0.7,
        kl_coef=0.05,
        gold_steps=8,
        eval_steps=-1,
        **ADAPTERS,
    ),
    "online_dpo": dict(
        rounds=2, dpo_epochs=1.0, dpo_beta=0.1, learning_rate=5e-5, max_new_tokens=40, temperature=0.7, **ADAPTERS
    ),
}
QUICK = {  # a smoke test of the wiring: seconds, numbers meaningless
    "sft": dict(max_steps=4, batch_size=8),
    "rm": dict(max_steps=4, batch_size=8),
    "ppo": dict(max_steps=2, batch_size=8, max_new_tokens=8, gold_steps=1),
    "dpo": dict(max_steps=4, batch_size=8),
    "iterate": dict(
        rounds=2,
        max_steps=1,
        rm_initial_steps=2,
        rm_steps=2,
        rm_batch_size=8,
        batch_size=8,
        max_new_tokens=8,
        gold_steps=1,
    ),
    # a few DPO steps over the offline pairs, as the DPO stage takes, then one a round
    "online_dpo": dict(rounds=2, dpo_epochs=0.03, max_new_tokens=8),
}


@dataclass
class Plan:
    """One demo run's choices. ``settings``: options per stage (by name); ``sizes``: task rows (None: the task's
    defaults); ``no_kl_steps``: the beta = 0 ablation's steps; ``eval_samples``: samples per held-out prompt;
    ``value_model``: PPO's value function starts from the reward model (else a head on the policy);
    ``parameters``: the model's parameter count (0 for the built-in one, made by the demo); ``parameter_bytes``:
    the bytes a parameter takes in its saved weights;
    ``pairs_per_round``: iterated PPO's pairs per round (None: half the preference labels spread over its
    rounds, the other half offline)."""

    settings: dict[str, dict]
    sizes: dict[str, int] | None
    no_kl_steps: int
    eval_samples: int
    value_model: bool = True
    parameters: int = 0
    parameter_bytes: int = 4
    notes: list[str] = field(default_factory=list)
    pairs_per_round: int | None = None


def plan(quick: bool, model: str = "") -> Plan:
    """The stages' settings for the built-in model (``model`` empty) or a pretrained one."""
    parameters, parameter_bytes = model_size(model) if model else (0, 4)
    pretrained = parameters > LORA_ABOVE
    if quick:
        settings = {k: {**v, **ADAPTERS} if pretrained else v for k, v in QUICK.items()}
        if pretrained:
            settings["iterate"]["rm_lora_r"] = LORA["lora_r"]
        # few rows to score and evaluate (a pretrained model's every forward costs ~100x the built-in one's)
        sizes = (
            {"sft": 32, "sft_eval": 8, "prefs_train": 32, "prefs_eval": 16, "prompts_eval": 8}
            if pretrained
            else {"sft": 200, "sft_eval": 16, "prefs_train": 200, "prefs_eval": 100, "prompts_eval": 16}
        )
        return Plan(
            settings,
            sizes,
            2,
            1,
            parameters=parameters,
            parameter_bytes=parameter_bytes,
            pairs_per_round=8,
        )
    if pretrained:
        sizes = {"sft": 1200, "prefs_train": 600, "prefs_eval": 400}
        notes = [f"{parameters / 1e6:.0f}M parameters: LoRA (r = 16) on every stage, reward and value models too"]
        # Two samples per held-out prompt: a single reply's gold score varies widely, and one sample for each of
        # the held-out prompts leaves two policies' difference too uncertain to rank them.
        return Plan(
            PRETRAINED,
            sizes,
            24,  # the beta = 0 run: half again PPO's steps, as on the built-in model
            2,
            parameters=parameters,
            parameter_bytes=parameter_bytes,
            notes=notes,
        )
    # Rows of task data: more than the task's defaults, so the SFT steps see each demonstration a few times
    # rather than dozens (less overfitting), and the held-out pairs measure the reward model's accuracy (and the
    # label-noise ceiling) to about a point.
    sizes = {"sft": 8000, "prefs_train": 8000, "prefs_eval": 2000}
    # The beta = 0 ablation runs longer than PPO with the penalty: over-optimisation takes more steps to show than
    # the penalised run takes to level off, and the learning rate decays linearly to 0 over --max-steps, so a
    # run as long as PPO's, without the penalty, slows down just as its gold score turns. Run longer, its logged
    # gold peaks early and then falls below the penalised run's (docs/demo.md). Four samples per held-out prompt:
    # with one, a policy's mean gold score moves with the sampling seed alone by more than the policies differ.
    return Plan(TINY, sizes, 100, 4, parameters=parameters, parameter_bytes=parameter_bytes)


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
