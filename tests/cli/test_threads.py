"""--threads: every command that runs a model takes it; torch's threads are set while the command runs and put
back after."""

from __future__ import annotations

import torch

from rlhfkit.cli.main import COMMANDS, main
from rlhfkit.config.parse import leaves


def test_every_command_that_runs_a_model_has_threads():
    without = [name for name, cmd in COMMANDS.items() if "threads" not in {leaf.name for leaf in leaves(cmd.config())}]
    assert without == ["label", "view"]  # web pages: no model runs there


def test_threads_hold_while_the_command_runs_and_are_put_back(monkeypatch, tiny_corpus, tmp_path):
    import rlhfkit.models.init_model as target

    seen = []
    real = target.init_model

    def recording(cfg):
        seen.append(torch.get_num_threads())
        return real(cfg)

    monkeypatch.setattr(target, "init_model", recording)
    before = torch.get_num_threads()
    wanted = before + 1
    code = main(
        ["init-model", "--corpus", str(tiny_corpus), "--output-dir", str(tmp_path / "m"), "--threads", str(wanted)]
    )
    assert code == 0 and seen == [wanted]
    assert torch.get_num_threads() == before
    assert main(["init-model", "--corpus", str(tiny_corpus), "--output-dir", str(tmp_path / "n")]) == 0
    assert seen == [wanted, before]  # 0, the default: left as it is
