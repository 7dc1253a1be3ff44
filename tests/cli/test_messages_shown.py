"""How rlhfkit's log messages reach a person: short lines on stderr while a command runs from the command line
(INFO, DEBUG with --debug), the same from the Python API unless the program set up logging itself."""

from __future__ import annotations

import logging

import pytest

from rlhfkit.commands import messages_shown

log = logging.getLogger("rlhfkit.iterated.loop")


def _say_everything() -> None:
    log.debug("the sampler's batch size")
    log.info("round 1: 16 labelled pairs")
    log.warning("the accuracy did not move")


def unconfigured(monkeypatch) -> None:
    """Logging as a plain Python program has it: no handlers anywhere (pytest's own, added to the root logger for
    the test's body, set aside)."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])


def test_info_and_warnings_show_as_short_lines_and_debug_only_when_asked(capsys, monkeypatch):
    unconfigured(monkeypatch)
    with messages_shown(logging.INFO):
        _say_everything()
    out, err = capsys.readouterr()
    assert out == "" and err == "round 1: 16 labelled pairs\nwarning: the accuracy did not move\n"
    with messages_shown(logging.DEBUG):
        _say_everything()
    assert capsys.readouterr().err.splitlines() == [
        "[rlhfkit.iterated.loop] the sampler's batch size",
        "round 1: 16 labelled pairs",
        "warning: the accuracy did not move",
    ]


def test_the_logger_is_put_back_afterwards_even_when_the_command_fails(capsys, monkeypatch):
    unconfigured(monkeypatch)
    logger = logging.getLogger("rlhfkit")
    with pytest.raises(RuntimeError), messages_shown(logging.INFO):
        raise RuntimeError("stopped")
    assert logger.level == logging.NOTSET and logger.handlers == []
    _say_everything()  # no handler of ours left: only Python's last resort, for the warning
    assert "round 1" not in capsys.readouterr().err


def test_the_api_shows_info_where_the_program_set_up_no_logging(capsys, monkeypatch):
    unconfigured(monkeypatch)
    with messages_shown(unless_configured=True):
        _say_everything()
    assert capsys.readouterr().err == "round 1: 16 labelled pairs\nwarning: the accuracy did not move\n"


def test_the_api_leaves_a_program_s_own_logging_alone(capsys, caplog):
    caplog.set_level(logging.WARNING)  # the program's choice: warnings only, through its own handler
    with messages_shown(unless_configured=True):
        _say_everything()
    assert capsys.readouterr().err == ""  # nothing of ours printed beside the program's handler
    assert [r.getMessage() for r in caplog.records] == ["the accuracy did not move"]
    assert logging.getLogger("rlhfkit").handlers == []
