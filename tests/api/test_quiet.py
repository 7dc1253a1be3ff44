"""A Python API call is as quiet as the command line: no transformers progress bars, warnings or load reports,
and the caller's transformers settings are as they were afterwards."""

from __future__ import annotations

import logging

import pytest

import rlhfkit

from ..helpers import pref_rows, sft_rows

NOISE = ("Loading weights", "Writing model shards", "LOAD REPORT", "MISSING", "attention_mask", "attention mask")


@pytest.fixture
def chatty_transformers():
    """transformers as a fresh Python session has it: warnings shown, progress bars on (a command-line test
    earlier in this process silences it for good), and its once-only warnings not yet given."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_warning()
    hf_logging.enable_progress_bar()
    logging.Logger.warning_once.cache_clear()
    yield hf_logging
    hf_logging.set_verbosity(level)
    if bars:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()


def _transformers_records(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("transformers")]


def test_sft_and_rm_print_no_transformers_noise(tiny_model_dir, tmp_path, capfd, caplog, chatty_transformers):
    """Progress bars are read from the captured output; transformers' warnings from its log records (its
    handler writes to the stderr of when it was set up, which may be a capture other than this test's)."""
    from transformers import AutoModelForSequenceClassification

    # The control: outside the API, loading shows a progress bar and a new reward head's load report.
    capfd.readouterr()
    AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    assert "Loading weights" in "".join(capfd.readouterr())
    assert any("LOAD REPORT" in m and "score.weight" in m for m in _transformers_records(caplog))
    caplog.clear()

    sft = rlhfkit.sft(
        model=str(tiny_model_dir), data=sft_rows(16), output_dir=tmp_path / "sft", max_steps=2, progress=False
    )
    rm = rlhfkit.rm(
        model=str(sft.output_dir),
        data=pref_rows(16),
        eval_data=pref_rows(8, seed=1),
        output_dir=tmp_path / "rm",
        max_steps=2,
        progress=False,
    )
    assert (rm.output_dir / "model.safetensors").is_file()
    out, err = capfd.readouterr()
    for noise in NOISE:
        assert noise not in out + err, f"{noise!r} in the output:\n{out}{err}"
    assert _transformers_records(caplog) == []
    # the caller's settings are back
    assert chatty_transformers.get_verbosity() == logging.WARNING
    assert chatty_transformers.is_progress_bar_enabled()


def test_settings_are_restored_when_the_call_fails(tiny_model_dir, tmp_path, chatty_transformers):
    chatty_transformers.set_verbosity_info()
    chatty_transformers.disable_progress_bar()
    with pytest.raises(rlhfkit.UserError):
        rlhfkit.score(reward_model=str(tiny_model_dir), data=[{"prompt": "a", "response": "b"}], output=tmp_path / "s")
    assert chatty_transformers.get_verbosity() == logging.INFO
    assert not chatty_transformers.is_progress_bar_enabled()
