"""--report-to: the experiment trackers get the same values at the same steps as metrics.jsonl, and the run's
options; each tracker is read back from its own offline store (TensorBoard's event files, wandb's offline run
file, Trackio's local database, MLflow's file store). A tracker whose package is not installed is skipped here,
and stops a run before its model loads with the package to install."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import rlhfkit
from rlhfkit.cli.main import COMMANDS
from rlhfkit.config import trackers as report_to
from rlhfkit.config.commands import SFTConfig
from rlhfkit.config.parse import parse_config, part_names
from rlhfkit.errors import UserError
from rlhfkit.training import trackers

from ..helpers import launch, metrics, run_cli, sft_args, sft_rows, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
OFFLINE = ("wandb", "trackio", "mlflow")  # the trackers with their own store, run together in one training
PROJECT, RUN = "rlhfkit-tests", "tiny-sft"


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def needs(name: str):
    return pytest.mark.skipif(
        not installed(name), reason=f"{name} is not installed (pip install 'rlhfkit[{name}]'; in the test extra)"
    )


def sft_config(*flags: str) -> SFTConfig:
    cfg, _ = parse_config("rlhfkit sft", SFTConfig, ["--model", "m", "--data", "d", "--output-dir", "o", *flags])
    return cfg


# --- the option -------------------------------------------------------------------------------------------


def test_report_to_takes_several_names_spaced_comma_separated_or_repeated_and_defaults_to_tensorboard(tmp_path):
    assert sft_config().run.report_to == ["tensorboard"]
    assert sft_config("--report-to", "wandb", "tensorboard").run.report_to == ["wandb", "tensorboard"]
    assert sft_config("--report-to", "wandb,mlflow").run.report_to == ["wandb", "mlflow"]
    assert sft_config("--report-to", "wandb", "--report-to", "trackio").run.report_to == ["wandb", "trackio"]
    assert sft_config("--report-to", "none").run.report_to == ["none"]
    config = tmp_path / "c.yaml"
    config.write_text("report_to: [mlflow, tensorboard]\nrun_name: first\n")
    cfg = sft_config("--config", str(config))
    assert cfg.run.report_to == ["mlflow", "tensorboard"] and cfg.run.run_name == "first"


def test_every_training_command_has_report_to_project_and_run_name():
    training = [name for name, command in COMMANDS.items() if "run" in part_names(command.config())]
    assert set(training) >= {"sft", "rm", "dpo", "ppo", "grpo", "rloo"}, training
    for name in training:
        run = COMMANDS[name].config().run
        assert (run.report_to, run.project, run.run_name) == (["tensorboard"], "", ""), name


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--report-to", "comet"], "--report-to must be among tensorboard, wandb, trackio, mlflow, all, none, got"),
        (["--report-to", "none", "wandb"], "--report-to none cannot be given with other trackers"),
        (["--report-to", "all,tensorboard"], "--report-to all cannot be given with other trackers"),
    ],
)
def test_bad_report_to_is_a_one_line_error(flags, message):
    with pytest.raises(UserError) as info:
        sft_config(*flags)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_a_missing_tracker_package_stops_the_run_before_the_model_loads(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(report_to, "installed", lambda name: name != "wandb")  # --report-to's check
    data = write_jsonl(tmp_path / "train.jsonl", sft_rows(8))
    # the model folder does not exist either: the tracker is checked first, so its error is the one shown
    code, _, err = run_cli(capsys, *sft_args(tmp_path / "no-model", data, tmp_path / "out"), "--report-to", "wandb")
    assert code == 1
    expected = "error: --report-to wandb needs the wandb package: pip install wandb (or pip install 'rlhfkit[wandb]')"
    assert err.strip() == expected
    assert not (tmp_path / "out").exists()
    with pytest.raises(UserError, match=r"^report_to='wandb' needs the wandb package: pip install wandb"):
        rlhfkit.sft(model=str(tmp_path / "no-model"), data=str(data), output_dir=tmp_path / "api", report_to="wandb")


def test_all_is_every_installed_tracker_and_none_is_none(monkeypatch):
    monkeypatch.setattr(trackers, "installed", lambda name: name in ("tensorboard", "mlflow"))
    assert trackers.tracker_names(["all"]) == ["tensorboard", "mlflow"]
    assert trackers.tracker_names(["none"]) == [] and trackers.tracker_names([]) == []
    assert trackers.tracker_names(["wandb,tensorboard", "wandb"]) == ["wandb", "tensorboard"]


def test_project_is_the_flag_else_the_trackers_own_variable_else_rlhfkit(monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    assert trackers.project_name("wandb", "") == "from-env"
    assert trackers.project_name("wandb", "given") == "given"
    assert trackers.project_name("mlflow", "") == "rlhfkit" and trackers.project_name("trackio", "") == "rlhfkit"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "experiment")
    assert trackers.project_name("mlflow", "") == "experiment"


def test_hyperparameters_are_scalars_every_tracker_takes():
    values = trackers.hyperparameters({"lr": 1e-3, "steps": 3, "lora": False, "fns": ["a.py:f", "b.py:g"], "tk": None})
    assert values == {"lr": 1e-3, "steps": 3, "lora": False, "fns": "a.py:f,b.py:g", "tk": "none"}


# --- TensorBoard, the default ---------------------------------------------------------------------------------


def tensorboard_scalars_and_hparams(folder: Path) -> tuple[dict[str, dict[int, float]], dict]:
    """Every scalar as {tag: {step: value}} and the logged hyperparameters, read from the event files."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventMultiplexer().AddRunsFromDirectory(str(folder))
    events.Reload()
    scalars, hparams = {}, {}
    for run, tags in events.Runs().items():
        accumulator = events.GetAccumulator(run)
        for tag in tags["scalars"]:
            scalars[tag] = {e.step: e.value for e in accumulator.Scalars(tag)}
        try:
            content = accumulator.PluginTagToContent("hparams")
        except KeyError:
            continue
        for raw in content.values():
            data = plugin_data_pb2.HParamsPluginData.FromString(raw)
            if data.HasField("session_start_info"):
                given = data.session_start_info.hparams
                hparams.update({k: getattr(given[k], given[k].WhichOneof("kind")) for k in given})
    return scalars, hparams


def assert_same_metrics(rows: list[dict], logged: dict[str, dict[int, float]], rel: float) -> None:
    """Every finite value of metrics.jsonl at its step in ``logged`` ({name: {step: value}}), and nothing more."""
    expected: dict[str, dict[int, float]] = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and value is not None:
                expected.setdefault(key, {})[row["step"]] = value
    assert set(logged) == set(expected), (sorted(logged), sorted(expected))
    for key, by_step in expected.items():
        assert logged[key] == pytest.approx(by_step, rel=rel), key


def test_tensorboard_by_default_gets_every_metric_and_the_options(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    evals = sft_rows(8, seed=5)
    rlhfkit.sft(model=str(tiny_model_dir), data=sft_rows(32), eval_data=evals, output_dir=out, max_steps=4,
                batch_size=4, eval_steps=2, learning_rate=1e-3, progress=False)  # fmt: skip
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and "eval/loss" in rows[1] and "eval/loss" not in rows[0]
    scalars, hparams = tensorboard_scalars_and_hparams(out / "tensorboard")
    assert_same_metrics(rows, scalars, rel=1e-6)  # TensorBoard keeps float32
    assert hparams["learning_rate"] == pytest.approx(1e-3) and hparams["max_steps"] == 4
    assert hparams["run_name"] == "run" and hparams["report_to"] == "tensorboard"


def shorter(prompts, completions, **columns):
    return [-len(c) / 20 for c in completions]


def test_grpo_sends_its_metrics_and_sampled_completions_to_tensorboard(tiny_model_dir, tmp_path):
    out = tmp_path / "grpo"
    prompts = [{"prompt": r["prompt"]} for r in sft_rows(16)]
    rlhfkit.grpo(model=str(tiny_model_dir), data=prompts, reward_fns=[shorter], output_dir=out, max_steps=2,
                 batch_size=8, num_generations=4, max_new_tokens=6, progress=False)  # fmt: skip
    rows = metrics(out)
    scalars, hparams = tensorboard_scalars_and_hparams(out / "tensorboard")
    assert_same_metrics(rows, scalars, rel=1e-6)
    assert "reward/score" in scalars and hparams["num_generations"] == 4
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    texts = tensorboard_texts(out / "tensorboard", "samples")
    assert sorted(texts) == sorted({s["step"] for s in samples}) and samples[0]["prompt"] in texts[samples[0]["step"]]


def tensorboard_texts(folder: Path, tag: str) -> dict[int, str]:
    """The markdown text logged under ``tag``, by step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(folder))
    events.Reload()
    return {
        e.step: tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in events.Tensors(f"{tag}/text_summary")
    }


def test_with_two_processes_only_the_main_one_writes_to_the_trackers(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "train.jsonl", sft_rows(32))
    out = tmp_path / "run"
    done = launch(sft_args(tiny_model_dir, data, out, max_steps=3, batch_size=4) + ["--cpu"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1  # one writer, not one per process
    scalars, _ = tensorboard_scalars_and_hparams(out / "tensorboard")
    assert_same_metrics(metrics(out), scalars, rel=1e-6)


def test_report_to_none_writes_metrics_jsonl_only(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    rlhfkit.sft(model=str(tiny_model_dir), data=sft_rows(16), output_dir=out, max_steps=2, batch_size=4,
                report_to="none", progress=False)  # fmt: skip
    assert [r["step"] for r in metrics(out)] == [1, 2]
    assert not (out / "tensorboard").exists()


# --- wandb, Trackio, MLflow: one training reporting to the installed ones, each read back from its store ------


@pytest.fixture(scope="module")
def offline_run(tiny_model_dir, tmp_path_factory):
    """`rlhfkit sft --report-to wandb trackio mlflow` (those installed) in a process of its own, with every
    tracker writing under a temporary folder: wandb offline, Trackio's local database, MLflow's file store."""
    names = [name for name in OFFLINE if installed(name)]
    if not names:
        pytest.skip("none of wandb, trackio, mlflow is installed (pip install 'rlhfkit[wandb,trackio,mlflow]')")
    root = tmp_path_factory.mktemp("trackers")
    data = write_jsonl(root / "train.jsonl", sft_rows(32))
    evals = write_jsonl(root / "eval.jsonl", sft_rows(8, seed=5))
    out = root / RUN
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(root),
        "WANDB_SILENT": "true",
        "WANDB_PROJECT": "ignored-as-the-flag-wins",
        "TRACKIO_DIR": str(root / "trackio"),
        "MLFLOW_TRACKING_URI": (root / "mlruns").as_uri(),
        "MLFLOW_ALLOW_FILE_STORE": "true",  # MLflow 3 asks for a database store unless told the files are wanted
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    args = sft_args(tiny_model_dir, data, out, max_steps=4, batch_size=4, eval_data=evals, eval_steps=2)
    args += ["--report-to", ",".join(names), "--project", PROJECT, "--learning-rate", "0.001"]
    done = subprocess.run(
        [sys.executable, "-m", "rlhfkit", *args], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and "eval/loss" in rows[1]
    return root, rows, yaml.safe_load((out / "config.yaml").read_text()), env


def wandb_records(path: Path):
    """The records of a wandb run file: a 7-byte header, then 32 KiB blocks of chunks (crc32, length, type:
    1 whole, 2 first, 3 middle, 4 last) that join into serialised ``Record`` protobufs."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, pending = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def name(item) -> str:
    """A wandb history or config item's name: ``key``, or the parts of ``nested_key``."""
    return item.key or "/".join(item.nested_key)


@needs("wandb")
def test_wandb_offline_run_has_the_metrics_and_the_options(offline_run):
    root, rows, options, _ = offline_run
    (path,) = glob.glob(str(root / "wandb" / "offline-run-*" / "run-*.wandb"))
    logged, config, runs = {}, {}, []
    for record in wandb_records(Path(path)):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            runs.append((record.run.project, record.run.display_name))
        elif kind == "history":
            items = {name(item): json.loads(item.value_json) for item in record.history.item}
            for key, value in items.items():
                if not key.startswith("_"):
                    logged.setdefault(key, {})[items["_step"]] = value
        elif kind == "config":
            config.update({name(item): json.loads(item.value_json) for item in record.config.update})
    assert runs[0] == (PROJECT, RUN)
    assert_same_metrics(rows, logged, rel=1e-12)
    assert config["learning_rate"] == options["learning_rate"] == 1e-3
    assert config["max_steps"] == 4 and config["report_to"] == ",".join(options["report_to"])


@needs("trackio")
def test_trackio_local_store_has_the_metrics_and_the_options(offline_run):
    root, rows, options, env = offline_run
    read = (
        "import json; from trackio.sqlite_storage import SQLiteStorage as S; "
        f"print(json.dumps({{'logs': S.get_logs({PROJECT!r}, {RUN!r}), "
        f"'config': S.get_run_config({PROJECT!r}, {RUN!r})}}))"
    )
    done = subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    stored = json.loads(done.stdout.strip().splitlines()[-1])
    logged = {}
    for entry in stored["logs"]:
        for key, value in entry.items():
            if key not in ("step", "timestamp"):
                logged.setdefault(key, {})[entry["step"]] = value
    assert_same_metrics(rows, logged, rel=1e-12)
    assert stored["config"]["learning_rate"] == options["learning_rate"] and stored["config"]["max_steps"] == 4


@needs("mlflow")
def test_mlflow_file_store_has_the_metrics_and_the_options(offline_run, monkeypatch):
    root, rows, options, env = offline_run
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name(PROJECT)
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == RUN
    logged = {
        key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)} for key in run.data.metrics
    }
    assert_same_metrics(rows, logged, rel=1e-12)
    assert float(run.data.params["learning_rate"]) == options["learning_rate"]
    assert run.data.params["max_steps"] == "4" and run.data.params["run_name"] == RUN
