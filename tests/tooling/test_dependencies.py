"""The tested dependency set (constraints.txt) and `make test-latest`'s reading of what broke what."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ci_dependencies", ROOT / ".ci" / "dependencies.py")
deps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(deps)


def test_constraints_pin_every_requirement_within_its_range():
    pins = deps.parse_pins((ROOT / "constraints.txt").read_text())
    requirements = [Requirement(r) for r in deps._requirements()]
    names = {deps.canonical(r.name) for r in requirements}
    assert {"transformers", "accelerate", "peft", "datasets", "tokenizers", "pytest", "selenium"} <= names
    for req in requirements:
        if deps.canonical(req.name) == "torch":
            assert "torch" not in pins  # the Makefile pins torch, so a CUDA build already installed is kept
            continue
        _, version = pins[deps.canonical(req.name)]
        assert req.specifier.contains(version, prereleases=True), (req, version)


def test_upgrades_lists_what_differs_direct_requirements_first():
    tested = {"zlib-ng": ("zlib-ng", "1.0"), "transformers": ("transformers", "5.24.0"), "same": ("same", "1")}
    latest = {"zlib-ng": ("zlib-ng", "1.1"), "transformers": ("transformers", "5.25.0"), "same": ("same", "1")}
    latest["new-dep"] = ("new-dep", "0.1")
    assert deps.upgrades(tested, latest) == [
        ("transformers", "5.24.0", "5.25.0"),
        ("new-dep", None, "0.1"),
        ("zlib-ng", "1.0", "1.1"),
    ]


def test_blame_names_the_upgrade_whose_rollback_fixes_each_test():
    installed = {"a": "2", "b": "2", "c": "2"}
    breaks = {"t1": {"b"}, "t2": {"c"}, "t3": {"a", "c"}}  # t3 needs both a and c rolled back at once

    def pip_install(spec):
        name, version = spec.split("==")
        installed[name] = version

    def run_tests(tests):
        return [t for t in tests if any(installed[p] == "2" for p in breaks[t])]

    changed = [("a", "1", "2"), ("b", "1", "2"), ("c", "1", "2")]
    found = deps.blame(["t1", "t2", "t3"], changed, pip_install, run_tests)
    assert found == {
        "b 1 -> 2": ["t1"],
        "c 1 -> 2": ["t2"],
        "no single upgrade (several together, or the machine)": ["t3"],
    }
    assert installed == {"a": "2", "b": "2", "c": "2"}  # every rollback undone


def test_failed_tests_reads_node_ids_from_a_junit_report(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.tooling.test_dependencies" name="test_ok"/>'
        '<testcase classname="tests.tooling.test_dependencies" name="test_bad[x]"><failure message="m"/></testcase>'
        '<testcase classname="tests.models.test_sampling_fast_paths" name="test_err"><error message="e"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert deps.failed_tests(report) == [
        "tests/tooling/test_dependencies.py::test_bad[x]",
        "tests/models/test_sampling_fast_paths.py::test_err",
    ]
