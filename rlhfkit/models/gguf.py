"""Models given as a ``.gguf`` file (llama.cpp's format, how many chat models are shipped quantised).

``--model`` (and ``--reward-model``, ``--ref-model``, ``--value-model``) may name a ``.gguf`` file instead of a
Hugging Face folder. transformers reads it with the ``gguf`` package (``pip install 'rlhfkit[gguf]'``) and
de-quantises the weights to fp32; the architecture, the tokenizer and its chat template come along. Training
then starts from the de-quantised weights: the quantisation error stays in them, and everything rlhfkit writes
is a plain safetensors Hugging Face folder.

De-quantising takes tens of seconds for a 100M-parameter model, and a PPO run loads its model up to three
times (policy, reference, value model), so each file is converted once into a Hugging Face folder under
rlhfkit's cache (``rlhfkit.cache``), keyed by the file's content, and loaded from there like any other folder.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
from pathlib import Path

from filelock import FileLock

from rlhfkit.cache import cache_root
from rlhfkit.errors import UserError

logger = logging.getLogger(__name__)

DONE = "dequantised-from.txt"  # written last: its presence marks a complete folder


def is_gguf(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(".gguf")


def gguf_available() -> bool:
    try:
        import gguf  # noqa: F401
    except ImportError:
        return False
    return True


def file_digest(path: Path) -> str:
    """SHA-256 of the file's content, read once per process for a given path, size and modification time (a
    run asks for its model's folder several times: tokenizer, policy, reference, value model)."""
    stat = path.stat()
    return _digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            sha.update(block)
    return sha.hexdigest()


def dequantised_folder(path: str | os.PathLike, what: str = "model") -> Path:
    """The Hugging Face folder (fp32 safetensors, config, tokenizer, generation config) of the ``.gguf`` file
    ``path``, converted on first use and kept in the cache."""
    gguf_file = Path(path)
    if not gguf_file.is_file():
        raise UserError(f"{path}: {what} file does not exist")
    if not gguf_available():
        raise UserError(f"{path}: reading a .gguf file needs the gguf package: pip install 'rlhfkit[gguf]'")
    folder = cache_root() / "gguf" / f"{gguf_file.stem}-{file_digest(gguf_file)[:16]}"
    if (folder / DONE).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(folder.with_name(folder.name + ".lock")):  # one process converts; the others wait, then load
        if not (folder / DONE).is_file():
            _convert(gguf_file, folder, what)
    return folder


def _convert(gguf_file: Path, folder: Path, what: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("de-quantising %s to fp32 (once; kept in %s)", gguf_file, folder)
    where = {"pretrained_model_name_or_path": str(gguf_file.parent), "gguf_file": gguf_file.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(**where, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32, local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise UserError(f"{gguf_file}: cannot read as a {what} ({str(exc).splitlines()[0]})") from None
    # transformers marks a model read from GGUF as quantised and will not save it; its weights are plain fp32
    # tensors by now, so they go into an unmarked model of the same config
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    tmp = folder.with_name(folder.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / DONE).write_text(f"{gguf_file.resolve()}\n", encoding="utf-8")
    shutil.rmtree(folder, ignore_errors=True)  # a folder left half-written by an interrupted conversion
    os.replace(tmp, folder)
