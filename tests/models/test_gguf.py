"""A `.gguf` model path: one line when the file is missing or the gguf package is not installed; the
conversion itself is exercised on a real model in tests/real."""

from __future__ import annotations

import pytest

from rlhfkit.errors import UserError
from rlhfkit.models import gguf
from rlhfkit.models.loading import load_causal_lm, load_reward_model, load_tokenizer


def test_a_missing_gguf_file_is_one_line(tmp_path):
    missing = tmp_path / "nothing.gguf"
    with pytest.raises(UserError, match=r"nothing\.gguf: model file does not exist"):
        load_tokenizer(str(missing))
    with pytest.raises(UserError, match=r"nothing\.gguf: reward model file does not exist"):
        load_reward_model(str(missing))


def test_without_the_gguf_package_the_error_names_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    monkeypatch.setattr(gguf, "gguf_available", lambda: False)
    with pytest.raises(
        UserError, match=r"model\.gguf: reading a \.gguf file needs the gguf package: pip install 'rlhfkit\[gguf\]'"
    ):
        load_causal_lm(str(path))


def test_the_cache_folder_is_keyed_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHFKIT_CACHE_DIR", str(tmp_path / "cache"))
    a, b = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for path, content in ((a, b"one"), (b, b"two")):
        path.parent.mkdir()
        path.write_bytes(content)
    converted = []
    monkeypatch.setattr(gguf, "gguf_available", lambda: True)
    monkeypatch.setattr(gguf, "_convert", lambda src, folder, what: converted.append(src) or _fake(folder))
    first = gguf.dequantised_folder(a)
    assert gguf.dequantised_folder(a) == first and converted == [a]  # once per file
    assert gguf.dequantised_folder(b) != first and converted == [a, b]  # same name, other content


def _fake(folder):
    folder.mkdir(parents=True)
    (folder / gguf.DONE).write_text("x")
