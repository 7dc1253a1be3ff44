"""The package's layers, read from the source with ``ast``: the library never imports the command line, rlhfkit's
own modules are imported at the top of a module (so what a module needs is in its first lines), no two packages
import each other, and a lower layer never imports a higher one (LAYERS).

A violation is reported as ``path:line`` and what it imports.
"""

from __future__ import annotations

import ast
import collections
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlhfkit"

# Lowest first; a unit is a subpackage or a module directly under rlhfkit ("__init__" is rlhfkit/__init__.py).
# Units in one set are one layer: they may import each other, but never so that two packages import each other.
LAYERS: list[set[str]] = [
    {"errors", "files", "cache"},
    {"ops"},  # the math, pure torch
    {"data"},
    {"tasks"},  # built-in tasks: pure Python, looked up by name from config, the trainers, evaluation and iterate
    {"config"},
    {"userfiles"},
    {"models"},  # plain PyTorch and transformers
    {"accel"},  # faster implementations that stand in for the models' functions while a command runs
    {"training"},
    {"multiturn"},  # rollouts over several turns, which the online trainers play
    {"trainers"},
    {"inference"},
    {"web"},
    {"labelling", "viewer"},
    {"judging"},
    {"commands"},  # the command registry and execute(): the commands' modules are imported by name when run
    {"iterated"},
    {"demo"},
    {"api", "__init__"},
    {"cli", "__main__"},
]
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}

# Imports of rlhfkit modules allowed inside a function: the wrappers of optional heavy dependencies (vLLM, gguf,
# trackers, browsers), which a module may import only where the feature is used. None is needed today.
HIDDEN_ALLOWED: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Import:
    importer: str  # the importing module, e.g. rlhfkit.iterated.loop
    target: str  # the rlhfkit module (or package) imported
    path: Path
    line: int
    top: bool  # at module level (also inside a module-level if / try), not in a function or class body

    def file(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    def where(self) -> str:
        return f"{self.file()}:{self.line}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    # `from rlhfkit import accel` imports the module rlhfkit.accel; `from rlhfkit.x import name` the module rlhfkit.x
    return [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]


def _top_level_nodes(tree: ast.Module) -> set[int]:
    top = {id(n) for n in tree.body}
    for node in tree.body:
        if isinstance(node, (ast.If, ast.Try)):
            top |= {id(inner) for inner in ast.walk(node) if not isinstance(inner, (ast.FunctionDef, ast.ClassDef))}
    return top


def _imports() -> list[Import]:
    modules = _modules()
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = _top_level_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, module, path.name == "__init__.py", modules):
                    if target == "rlhfkit" or target.startswith("rlhfkit."):
                        found.append(Import(module, target, path, node.lineno, id(node) in top))
    return list(dict.fromkeys(found))  # `from x import a, b` of one module once


IMPORTS = _imports()


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


Violation = tuple[list[str], str]  # the importing files, what is wrong


def library_imports_of_the_cli() -> list[Violation]:
    return [
        ([i.file()], f"{i.where()} {i.importer} imports {i.target}")
        for i in IMPORTS
        if unit(i.target) == "cli" and unit(i.importer) not in ("cli", "__main__")
    ]


def hidden_imports() -> list[Violation]:
    return [
        ([i.file()], f"{i.where()} {i.importer} imports {i.target} inside a function")
        for i in IMPORTS
        if not i.top and i.target not in HIDDEN_ALLOWED
    ]


def package_cycles() -> list[Violation]:
    """Each group of units that import one another, directly or round a loop (strongly connected components)."""
    edges = collections.defaultdict(set)
    witness = {}
    for i in IMPORTS:
        a, b = unit(i.importer), unit(i.target)
        if a != b:
            edges[a].add(b)
            witness.setdefault((a, b), i)
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    out = []
    for group in groups:
        links = [witness[a, b] for a in group for b in sorted(edges[a]) if b in group]
        text = "; ".join(f"{unit(i.importer)} -> {unit(i.target)} ({i.where()})" for i in links)
        out.append(([i.file() for i in links], f"cycle between {', '.join(group)}: {text}"))
    return out


def upward_imports() -> list[Violation]:
    out = []
    for i in IMPORTS:
        a, b = unit(i.importer), unit(i.target)
        if a == b:
            continue
        if a not in LAYER or b not in LAYER:
            missing = a if a not in LAYER else b
            out.append(([i.file()], f"{i.where()} {missing} has no place in LAYERS"))
        elif LAYER[a] < LAYER[b]:
            out.append(([i.file()], f"{i.where()} {i.importer} ({a}) imports {i.target} ({b}), a higher layer"))
    return out


RULES = {
    "the library never imports the CLI": library_imports_of_the_cli,
    "rlhfkit's modules are imported at the top": hidden_imports,
    "no two packages import each other": package_cycles,
    "no import against the layer order": upward_imports,
}


@pytest.mark.parametrize("rule", list(RULES))
def test_the_rule_holds(rule):
    violations = [text for _, text in RULES[rule]()]
    assert not violations, f"{rule}: {len(violations)} violation(s)\n" + "\n".join(violations)


def test_the_checks_see_what_they_check():
    """The reader finds imports in every form the package uses, and every unit has a layer."""
    kinds = {(i.importer, i.target, i.top) for i in IMPORTS}
    assert ("rlhfkit.commands", "rlhfkit.accel", True) in kinds  # from rlhfkit import accel
    assert ("rlhfkit.tasks.notes", "rlhfkit.tasks.raters", True) in kinds  # from ..raters import ...
    assert ("rlhfkit.__main__", "rlhfkit.cli.main", True) in kinds
    assert {unit(m) for m in _modules()} <= set(LAYER), "a unit of rlhfkit has no place in LAYERS"
