"""The house plan holds: no import cycle inside tpu_ray, nothing imports the CLI, and the sharding
side never imports TensorFlow."""

from __future__ import annotations

import pytest

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tpu_ray"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every tpu_ray module a file imports, at top level or inside functions (lazy imports count:
    a cycle through a function body still couples the two modules)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpu_ray"):
            found.add(node.module)
            for alias in node.names:  # `from tpu_ray.prepare import shards` imports a module
                if (PACKAGE.parent / (node.module + "." + alias.name).replace(".", "/")).with_suffix(".py").exists():
                    found.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tpu_ray"))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    # A package's __init__ is not an edge target of interest: importing tpu_ray.x.y runs tpu_ray.x's
    # (docstring-only) __init__, which imports nothing.
    return {name: {m for m in _imports(path) if m in modules and m != name and m != "tpu_ray"}
            for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.quick
def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.quick
def test_nothing_imports_the_command_line():
    importers = [name for name, deps in import_graph().items() if "tpu_ray.cli" in deps]
    jobs = Path(__file__).resolve().parents[1] / "jobs"
    importers += [p.name for p in jobs.glob("*.py") if "tpu_ray.cli" in _imports(p)]
    assert importers == []


@pytest.mark.quick
def test_subpackage_inits_import_nothing():
    """`import tpu_ray.prepare.shards` in a sharding actor must not pull in training code."""
    for init in PACKAGE.glob("*/__init__.py"):
        assert not _imports(init), f"{init} imports {_imports(init)}"


def test_the_preparation_side_never_imports_tensorflow():
    """Shard actors may run on TPU hosts' neighbours; TensorFlow there would take memory and, on a
    TPU host, the libtpu lock. Checked in a fresh interpreter."""
    code = ("import sys, tpu_ray, tpu_ray.prepare.shards, tpu_ray.prepare.tokenizer, tpu_ray.prepare.corpus, "
            "tpu_ray.pipeline, tpu_ray.cli, tpu_ray.report; print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
