"""bench/reported and the docs' result tables: the tables in the docs are what bench/tables.py renders from the
result files, every run is filed under the machine and commit its stamp records, and a benchmark's new run is
merged into its file beside the runs already there; the seeds benchmark's demo command."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load(name: str):
    """A bench/ script as a module (bench/ is not a package; its scripts import each other by plain name)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


tables = load("tables")
results_file = load("results_file")


def test_docs_tables_are_what_the_result_files_give(capsys):
    code = tables.main(["--check"])
    assert code == 0, capsys.readouterr().out + "\nrun: .venv/bin/python bench/tables.py"


def test_check_fails_when_a_table_differs(tmp_path, capsys):
    doc = tmp_path / "performance.md"
    text = (BENCH.parent / "docs" / "performance.md").read_text()
    line = "| PPO against TRL 1.12 | tiny (0.23M) | AMD EPYC, AVX2, 2 cores | 3 | 0.47 | 1.11 |"
    assert line in text
    doc.write_text(text.replace(line, line.replace("| 1.11 |", "| 1.01 |")))
    assert tables.main(["--check", str(doc)]) == 1
    assert "+" + line in capsys.readouterr().out
    assert tables.main([str(doc)]) == 0  # rewrites it
    assert doc.read_text() == text


def test_every_run_is_filed_under_its_stamp():
    files = sorted((BENCH / "reported").glob("*.json"))
    assert [f.name for f in files] == [
        "accel_ab.json",
        "adapter_load.json",
        "demo.json",
        "dpo_beta.json",
        "grpo_vs_trl.json",
        "iterate_tasks.json",
        "judge.json",
        "label_load.json",
        "loss_aggregation.json",
        "ppo_critic.json",
        "ppo_vs_trl.json",
        "profile_ppo.json",
        "real_model.json",
        "real_model_gpu.json",
        "rm_lora.json",
        "vllm_engine.json",
        "vllm_learning.json",
    ]
    for f in files:
        data = json.loads(f.read_text())
        assert data["benchmark"] == f.stem
        for machine, key, run in results_file.runs(data):
            stamp = run["stamp"]
            assert results_file.machine_key(stamp) == machine, (f.name, key)
            commit = stamp["commit"]
            assert key.split(" ")[0] == commit.removesuffix("-dirty")[:12] + ("-dirty" if "-dirty" in commit else "")
            if stamp.get("machine_key"):  # a key not read from the CPU says where it comes from
                assert stamp.get("machine_key_source")


def test_run_key_names_the_options_that_differ_from_the_defaults():
    defaults = {"sizes": "tiny,small", "steps": 20, "skip_trl": False, "compile_decode": "tiny", "out": "a.json"}
    args = {"sizes": "tiny", "steps": 20, "skip_trl": True, "compile_decode": "", "out": "b.json"}
    assert results_file.option_text(args, defaults) == "--sizes tiny --skip-trl --compile-decode ''"
    assert results_file.run_key("0123456789abcdef" * 2 + "-dirty", args, defaults).startswith("0123456789ab-dirty --")
    assert results_file.run_key("f" * 40, {"out": "c.json"}, defaults) == "f" * 12


def test_merge_replaces_the_same_run_and_keeps_the_others(tmp_path):
    path = tmp_path / "bench.json"
    results_file.merge(path, "ppo_vs_trl", "cpu A", "abc", {"n": 1})
    results_file.merge(path, "ppo_vs_trl", "cpu A", "abc --sizes tiny", {"n": 2})
    results_file.merge(path, "ppo_vs_trl", "cpu B", "abc", {"n": 3})
    results_file.merge(path, "ppo_vs_trl", "cpu A", "abc", {"n": 4})  # measured again
    data = json.loads(path.read_text())
    assert data == {
        "benchmark": "ppo_vs_trl",
        "machines": {"cpu A": {"abc": {"n": 4}, "abc --sizes tiny": {"n": 2}}, "cpu B": {"abc": {"n": 3}}},
    }
    assert not list(tmp_path.glob("*.tmp"))


def test_a_single_run_file_is_read_as_one_run(tmp_path):
    path = tmp_path / "old.json"
    stamp = {
        "commit": "f" * 40,
        "date": "2026-01-01T00:00:00Z",
        "machine": {"cpu": "X", "isa": "avx2", "logical_cores": 4},
    }
    path.write_text(json.dumps({"stamp": stamp, "sizes": {}}))
    results_file.merge(path, "grpo_vs_trl", "X; avx2; 4 cores", "eee", {"n": 1})
    data = json.loads(path.read_text())
    assert data["machines"]["X; avx2; 4 cores"] == {
        "ffffffffffff (2026-01-01T00:00:00Z)": {"stamp": stamp, "sizes": {}},
        "eee": {"n": 1},
    }


def test_a_benchmark_run_is_merged_under_its_machine_and_commit(tmp_path):
    pytest.importorskip("torch")
    common, stamp = load("common"), load("stamp")
    path = tmp_path / "ppo_vs_trl.json"
    results_file.merge(path, "ppo_vs_trl", "an earlier machine", "abc", {"n": 1})
    results = common.Results(
        path, stamp.Stamp(), "ppo_vs_trl", {"sizes": "tiny,small", "out": "x"}, args={"sizes": "tiny", "out": str(path)}
    )
    results["sizes"]["tiny"] = {"runs": {}}
    results.close()
    data = json.loads(path.read_text())
    machine = results_file.machine_key(results["stamp"])
    run = data["machines"][machine][results.run_key]
    assert results.run_key.endswith(" --sizes tiny")
    assert run["sizes"] == {"tiny": {"runs": {}}} and run["load_after"]
    assert data["machines"]["an earlier machine"] == {"abc": {"n": 1}}


def test_demo_seeds_runs_each_seed_resumable_with_the_demos_own_options(tmp_path):
    demo_seeds = load("demo_seeds")
    args = demo_seeds.argparse.Namespace(model="m.gguf", quick=False, threads=2, kl_ablation=None)
    cmd = demo_seeds.demo_command(args, 1, tmp_path / "seed1")
    assert cmd[cmd.index("--seed") + 1] == "1" and "--resume" in cmd and "--kl-ablation" not in cmd
    args.kl_ablation = "true"  # part of a demo run's identity: a seed started with it continues only with it
    cmd = demo_seeds.demo_command(args, 1, tmp_path / "seed1")
    assert cmd[cmd.index("--kl-ablation") + 1] == "true"


def test_ppo_critic_changes_only_the_value_function_and_the_steps(tmp_path):
    ppo_critic = load("ppo_critic")
    demo = tmp_path / "seed3"
    head = ppo_critic.variant_command(demo, "head:16", tmp_path / "out", 2)
    assert head[head.index("--config") + 1] == str(demo / "ppo" / "config.yaml")  # the demo's own PPO settings
    assert head[head.index("--value-model") + 1] == "" and head[head.index("--max-steps") + 1] == "16"
    model = ppo_critic.variant_command(demo, "model:24", tmp_path / "out", 2)
    assert "--value-model" not in model and model[model.index("--max-steps") + 1] == "24"
    with pytest.raises(SystemExit, match="head:STEPS or model:STEPS"):
        ppo_critic.variant_command(demo, "critic:16", tmp_path / "out", 2)


def test_the_iterate_table_and_its_t_test():
    iterate_tables = load("iterate_tables")
    # t = 3 / (sqrt(2.5) / sqrt(5)) = 4.243 with 4 degrees of freedom: p = 0.0132 (Student's t table)
    assert iterate_tables.t_test_p([1, 2, 3, 4, 5]) == pytest.approx(0.01324, abs=1e-4)
    assert iterate_tables.t_test_p([0.33, 0.16, 0.46]) == pytest.approx(0.0677, abs=1e-3)  # t(2) = 3.78
    assert iterate_tables.t_test_p([1.0]) is None and iterate_tables.t_test_p([2.0, 2.0]) is None

    def result(gain: float) -> dict:
        methods = {m: {"gain": gain, "gain_se": 0.1} for m in ("ppo", "iterated", "dpo", "online_dpo")}
        return {"sft_gold": 1.0, **methods, "iterated_minus_ppo": {"mean": gain - 0.5, "se": 0.1}}

    lines = iterate_tables.rows_of({"notes-0": result(1.0), "notes-1": result(2.0)})
    assert lines[0] == "| task | policy | seed 0 | seed 1 | mean ± s.e. over seeds |"
    assert "| | iterated PPO | +1.00 ± 0.10 | +2.00 ± 0.10 | +1.50 ± 0.50 |" in lines
    assert lines[-1].startswith("| | iterated − plain PPO | +0.50 ± 0.10 | +1.50 ± 0.10 | +1.00 ± 0.50, t-test p = ")
    assert lines[-1].endswith(", 2/2 > 0 |")
    assert not any("RM updates at 2e-5" in line for line in lines)  # a method the runs did not have is left out
