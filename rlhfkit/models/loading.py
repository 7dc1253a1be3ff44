"""Load local Hugging Face models and tokenizers: safetensors only, nothing from a hub.

A model is a Hugging Face folder, or a ``.gguf`` file: that is de-quantised once into a folder in rlhfkit's
cache (``rlhfkit.models.gguf``) and loaded from there, or a LoRA adapter folder (what a run with ``--save-merged
false`` writes): its base model (itself any of these) is loaded and the adapter merged into it in memory, so a
pipeline of LoRA runs saves adapters of a few megabytes where merged models take the whole model's size each.

A missing pad token is set to EOS (so padding works); ``trust_remote_code`` is passed only when the
user asks for it. Every ``from_pretrained`` here passes ``local_files_only=True``, so no hub is contacted.
Each loaded model goes through ``prepare_loaded``, here and only here.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlhfkit.errors import UserError, invocation
from rlhfkit.models.fastpath import replaceable
from rlhfkit.models.gguf import dequantised_folder, is_gguf
from rlhfkit.models.plain_lora import merge_plain_lora

STATS_FILE = "reward_stats.json"  # beside a reward model made by ``rlhfkit rm`` (``rlhfkit.models.reward``)
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MAX_CHAIN = 64  # adapters on adapters: more than any pipeline makes, fewer than a loop of bases


def adapter_settings(path: str) -> dict | None:
    """The ``adapter_config.json`` of a LoRA adapter folder (one without a ``config.json`` of its own); None for
    anything else."""
    p = Path(path)
    if not p.is_dir() or (p / "config.json").is_file() or not (p / ADAPTER_CONFIG).is_file():
        return None
    try:
        config = json.loads((p / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path}/{ADAPTER_CONFIG}: not valid JSON") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise UserError(f"{path}/{ADAPTER_CONFIG}: not a LoRA adapter (peft_type {config.get('peft_type')!r})")
    return config


def adapter_base(path: str) -> str | None:
    """The base model a LoRA adapter folder was trained on (its ``base_model_name_or_path``: a model folder, a
    ``.gguf`` file or another adapter folder; a relative path is read from the adapter's folder when it is not
    found from the working directory); None when ``path`` is not an adapter folder."""
    config = adapter_settings(path)
    if config is None:
        return None
    base = config.get("base_model_name_or_path") or ""
    if not base:
        merge = invocation("merge", adapter=str(path), model="BASE", output_dir="MERGED")
        raise UserError(f"{path}: a LoRA adapter that names no base model; merge it into its base: {merge}")
    if not Path(base).exists() and (Path(path) / base).exists():
        return str(Path(path) / base)
    return base


def adapter_chain(path: str) -> list[str]:
    """``path`` and the bases under it down to the first one that is not an adapter: [adapter, ..., model]."""
    chain = [str(path)]
    while (base := adapter_base(chain[-1])) is not None:
        if len(chain) > MAX_CHAIN:
            raise UserError(f"{path}: more than {MAX_CHAIN} LoRA adapters stacked on each other (a loop of bases?)")
        chain.append(base)
    return chain


def config_folder(path: str, what: str = "model") -> Path:
    """The folder whose ``config.json`` describes the model at ``path``: its own, a ``.gguf`` file's
    de-quantised folder, or for a LoRA adapter its base model's."""
    return Path(model_folder(adapter_chain(path)[-1], what))


def model_folder(path: str, what: str = "model") -> str:
    """The Hugging Face folder to load: ``path`` itself, or for a ``.gguf`` file its de-quantised folder."""
    return str(dequantised_folder(path, what)) if is_gguf(path) else str(path)


def check_model_dir(path: str, what: str = "model") -> Path:
    """Raise a UserError unless ``path`` is a local model directory with safetensors weights (or a ``.gguf``
    file, checked and de-quantised by ``model_folder``)."""
    p = Path(model_folder(path, what))
    if not p.exists():
        raise UserError(f"{path}: {what} directory does not exist")
    if not p.is_dir():
        raise UserError(f"{path}: {what} must be a directory (config.json, *.safetensors, tokenizer files)")
    base = adapter_base(str(p))
    if base is not None:  # a LoRA adapter: its weights here, its base checked in turn
        if not (p / ADAPTER_WEIGHTS).is_file():
            raise UserError(f"{path}: a LoRA adapter folder without {ADAPTER_WEIGHTS} (pickled weights are not loaded)")
        if not Path(model_folder(base, what)).exists():
            merge = invocation("merge", adapter=str(path), model="BASE", output_dir="MERGED")
            raise UserError(
                f"{path}: a LoRA adapter whose base model {base} is not here; merge it into its base: {merge}"
            )
        adapter_chain(str(p))  # a loop of bases is refused here
        check_model_dir(base, what)
        return p
    if not (p / "config.json").is_file():
        raise UserError(f"{path}: not a Hugging Face {what} directory (no config.json)")
    try:
        json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path}/config.json: not valid JSON") from None
    if not any(p.glob("*.safetensors")):
        pickled = [f.name for f in p.glob("*.bin")] + [f.name for f in p.glob("*.pt")]
        hint = (
            f" (found {', '.join(pickled)}: pickled weights are not loaded; convert them to safetensors)"
            if pickled
            else ""
        )
        raise UserError(f"{path}: no *.safetensors weights{hint}")
    return p


def load_tokenizer(path: str, trust_remote_code: bool = False, padding_side: str = "right", what: str = "model"):
    from transformers import AutoTokenizer

    path = str(check_model_dir(path, what))  # a clear message for a missing or non-model directory first
    if adapter_base(path) is not None and not (Path(path) / "tokenizer_config.json").is_file():
        path = str(check_model_dir(adapter_base(path), what))  # an adapter saved without its tokenizer: its base's
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot load the tokenizer ({str(exc).splitlines()[0]})") from None
    if tok.eos_token is None and tok.pad_token is None:
        raise UserError(f"{path}: the tokenizer has neither an EOS nor a pad token")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = padding_side
    return tok


def load_pretrained(auto_cls, path: str, what: str, trust_remote_code: bool, **kwargs):
    """``auto_cls.from_pretrained`` on a checked local directory (safetensors, no hub), then ``prepare_loaded``.
    A LoRA adapter folder: its base loaded so, the adapters merged into it (``merge_adapter``). The model's
    ``name_or_path`` is ``path`` as given, so an adapter trained on it names it as its base."""
    folder = str(check_model_dir(path, what))
    chain = adapter_chain(folder)
    base = str(check_model_dir(chain[-1], what))
    try:
        model = auto_cls.from_pretrained(
            base, trust_remote_code=trust_remote_code, use_safetensors=True, local_files_only=True, **kwargs
        )
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{base}: cannot load as a {what} ({str(exc).splitlines()[0]})") from None
    for adapter in reversed(chain[:-1]):
        model = merge_adapter(model, adapter)
    if chain[:-1]:
        model.requires_grad_(True)  # as from_pretrained leaves a model (PEFT's loading froze every weight)
    model.name_or_path = model.config._name_or_path = str(Path(path).resolve())
    prepare_loaded(model)
    return model


def merge_adapter(model, adapter: str):
    """``model`` with the LoRA adapter folder ``adapter`` merged into its weights (W + scale * B @ A; modules the
    adapter saved whole, such as a reward model's score head, replaced), as a plain model again. The adapter's
    parameter names are the same whatever model class wraps the backbone (a causal LM's adapter merges into the
    backbone of a reward model built from it). A float32 model and a plain LoRA adapter merge without PEFT
    (``rlhfkit.models.plain_lora``), to the same weights."""
    import torch
    from peft import LoraConfig, PeftModel

    if merge_plain_lora(model, adapter, adapter_settings(adapter) or {}):  # the plain case, without PEFT's wrapping
        return model
    config = LoraConfig.from_pretrained(adapter)
    config.task_type, config.inference_mode = None, True
    # PEFT draws the new adapters' initial weights before it loads the saved ones: on a forked generator, so a run
    # from an adapter folder draws the same random numbers as a run from the merged model
    with torch.random.fork_rng(devices=[]):
        try:
            wrapped = PeftModel.from_pretrained(model, adapter, config=config)
        except (ValueError, RuntimeError, KeyError) as exc:
            first = str(exc).splitlines()[0]
            raise UserError(f"{adapter}: cannot apply the LoRA adapter to its base ({first})") from None
    return wrapped.merge_and_unload()


@replaceable
def prepare_loaded(model) -> None:
    """Called on each model ``load_pretrained`` loads; in the plain code, nothing (a faster implementation may
    change how its modules compute, never what: ``rlhfkit.models.fastpath``)."""


def load_causal_lm(path: str, trust_remote_code: bool = False, tokenizer=None):
    """``AutoModelForCausalLM`` from a local directory, its pad token id set from the tokenizer. A reward
    model's directory is refused before loading (``check_kind``)."""
    from transformers import AutoModelForCausalLM

    check_kind(path, "causal LM")
    model = load_pretrained(AutoModelForCausalLM, path, "causal LM", trust_remote_code)
    if tokenizer is not None:
        match_tokenizer(model, tokenizer, path)
    return model


POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")


def position_limit(path: str) -> tuple[int, str] | None:
    """The most positions the model at ``path`` reads, and the config.json key that says so (a multimodal
    model's ``text_config`` included); None when its config names no limit."""
    config = json.loads((config_folder(path) / "config.json").read_text(encoding="utf-8"))
    for part in (config, config.get("text_config") if isinstance(config, dict) else None):
        if not isinstance(part, dict):
            continue
        for key in POSITION_KEYS:
            value = part.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, key
    return None


def architectures(path: str) -> list[str]:
    """The model classes a checked model directory's config.json names (``architectures``; a LoRA adapter's:
    its base model's, a reward model's adapter naming ``ForSequenceClassification``)."""
    settings = adapter_settings(path)
    if settings is not None and settings.get("task_type") == "SEQ_CLS":
        names = architectures(adapter_chain(path)[1])
        classifier = "ForSequenceClassification"
        return [n.replace("LMHeadModel", classifier).replace("ForCausalLM", classifier) for n in names]
    config = json.loads((config_folder(path) / "config.json").read_text(encoding="utf-8"))
    names = config.get("architectures") if isinstance(config, dict) else None
    return [str(name) for name in names or []]


def causal_lm_class(path: str) -> str | None:
    """The class a checked model directory's config.json names when it is a language model (e.g.
    ``GPT2LMHeadModel``, ``LlamaForCausalLM``) and not a sequence classifier; None otherwise."""
    names = architectures(path)
    if any("ForSequenceClassification" in name for name in names):
        return None
    lm = [name for name in names if name.endswith(("ForCausalLM", "LMHeadModel"))]
    return lm[0] if lm else None


def classifier_class(path: str) -> str | None:
    """What makes a checked model directory a reward model: the sequence-classifier class its config.json
    names (e.g. ``GPT2ForSequenceClassification``), or rlhfkit's score statistics beside it (``rlhfkit rm``
    writes them); None otherwise."""
    names = [name for name in architectures(path) if name.endswith("ForSequenceClassification")]
    if names:
        return names[0]
    return f"made by rlhfkit rm: {STATS_FILE}" if (Path(path) / STATS_FILE).is_file() else None


def check_kind(path: str, expected: str) -> None:
    """Raise a UserError, before any weights load, when the directory at ``path`` is the other kind of model
    than ``expected`` ("causal LM": a language model that generates, for a policy, a reference, generation
    and evaluation; "reward model": a sequence classifier with one output that scores). Decided by
    config.json's ``architectures`` (and rlhfkit's reward statistics); a directory naming neither passes."""
    folder = str(check_model_dir(path, expected))
    if expected == "causal LM":
        classifier = classifier_class(folder)
        if classifier is not None:
            raise UserError(
                f"{path}: is a reward model ({classifier}), not a causal LM: a policy, reference or model to "
                "sample from must be a language model that generates text (e.g. the SFT model a reward model "
                "was trained from)"
            )
        return
    lm = causal_lm_class(folder)
    if lm is not None:
        train = invocation("rm", model=str(path), data="PREFS.jsonl", output_dir="OUT")
        raise UserError(
            f"{path}: is a causal LM ({lm}), not a reward model (a sequence classifier with one output); "
            f"train a reward model from it on preference pairs: {train}"
        )


def load_reward_model(path: str, trust_remote_code: bool = False, tokenizer=None):
    """``AutoModelForSequenceClassification`` with one output (the scalar reward). A causal LM's directory
    is refused before loading (``check_kind``): transformers would give it a random two-output head."""
    from transformers import AutoModelForSequenceClassification

    check_kind(path, "reward model")
    # a reward model's LoRA adapter: its base is a causal LM (the SFT model), given the one-output head here
    heads = {"num_labels": 1} if adapter_base(str(check_model_dir(path, "reward model"))) is not None else {}
    model = load_pretrained(AutoModelForSequenceClassification, path, "reward model", trust_remote_code, **heads)
    if model.config.num_labels != 1:
        raise UserError(f"{path}: a reward model needs one output label, this one has {model.config.num_labels}")
    if tokenizer is not None:
        match_tokenizer(model, tokenizer, path)
    return model


def match_tokenizer(model, tokenizer, path: str) -> None:
    """Check the tokenizer fits the embedding; set the model's pad token id (batches > 1 need it)."""
    vocab = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > vocab:
        raise UserError(f"{path}: the tokenizer has {len(tokenizer)} tokens but the model's embedding only {vocab}")
    model.config.pad_token_id = tokenizer.pad_token_id
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.pad_token_id = tokenizer.pad_token_id
