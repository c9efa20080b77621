"""The house plan holds: no import cycle inside tpu_ray, no import that runs up the layers
(docs/layout.md), nothing imports the CLI, and the sharding side never imports TensorFlow."""

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


# Lowest first. A name is a top-level module of tpu_ray or one of its subpackages.
LAYERS: list[tuple[str, set[str]]] = [
    ("foundations", {"errors", "redact", "families", "accelerators", "storage", "logs", "confine", "tf_install",
                     "rundir", "runlock", "resume", "tables", "plots", "metrics_stream"}),
    ("configuration", {"config", "saved_config", "options_doc"}),
    ("watching runs", {"progress", "ray_gauges", "tracking"}),
    ("cluster", {"cluster"}),
    ("data preparation", {"prepare"}),
    ("training", {"train"}),
    ("downstream evaluation", {"downstream"}),
    ("reading runs", {"report", "comparison", "doctor"}),
    ("the pipeline", {"pipeline"}),
    ("entry points", {"cli", "__init__", "__main__"}),
]
RANK = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}


def _module_path(path: Path) -> str:
    """`tpu_ray/train/loop.py` -> `tpu_ray.train.loop` (`tpu_ray/__init__.py` -> `tpu_ray.__init__`)."""
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def _unit(module: str) -> str:
    """`tpu_ray.train.loop` -> `train`; `tpu_ray.report` -> `report`; `tpu_ray` -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _import_lines(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, imported tpu_ray module) for every import anywhere in the file."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("tpu_ray"):
            names = [f"tpu_ray.{a.name}" for a in node.names] if node.module == "tpu_ray" else [node.module]
            out += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "tpu_ray"]
    return out


@pytest.mark.quick
def test_every_module_has_a_layer():
    missing = sorted({_unit(_module_path(f)) for f in sorted(PACKAGE.rglob("*.py"))} - set(RANK))
    assert not missing, f"give these a layer in tests/test_layers.py (and docs/layout.md): {missing}"


def upward_in(module: str, source: str) -> list[str]:
    """`line: import` for each import in `source` (the text of `module`) from a layer above its own."""
    here = _unit(module)
    found = []
    for line, target in _import_lines(ast.parse(source)):
        there = _unit(target)
        if there != here and RANK.get(there, -1) > RANK.get(here, len(LAYERS)):
            found.append(f"{line}: {LAYERS[RANK[here]][0]} ({here}) imports {target} ({LAYERS[RANK[there]][0]})")
    return found


@pytest.mark.quick
def test_no_module_imports_from_a_layer_above_its_own():
    upward = [f"{f.relative_to(PACKAGE.parent)}:{line}" for f in sorted(PACKAGE.rglob("*.py"))
              for line in upward_in(_module_path(f), f.read_text())]
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


@pytest.mark.quick
def test_the_rule_sees_a_function_local_upward_import_and_allows_a_downward_one():
    source = "import os\nfrom tpu_ray.config import RunConfig\n\ndef f():\n    from tpu_ray.train.loop import train\n"
    assert upward_in("tpu_ray.cluster.placement", source) == [
        "5: cluster (cluster) imports tpu_ray.train.loop (training)"]
    assert upward_in("tpu_ray.pipeline", source) == []


# What makes an import slow enough to defer to the function that needs it: TensorFlow, Ray and the
# rest take seconds; pydantic, fsspec, yaml and numpy together most of a second, which `tpu-ray
# --help` and every CLI error would otherwise pay.
HEAVY_LIBRARIES = {"tensorflow", "tf_keras", "keras", "ray", "transformers", "torch", "datasets", "pandas",
                   "matplotlib", "tokenizers", "gcsfs", "google", "pyarrow", "safetensors", "huggingface_hub",
                   "jax", "rich", "fsspec", "pydantic", "yaml", "numpy"}


def _top_level_imports(tree: ast.Module) -> list[str]:
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [f"{node.module}.{a.name}" if node.module.startswith("tpu_ray") else node.module for a in node.names]
    return out


def heavy_modules() -> set[str]:
    """tpu_ray modules whose import (at their top level, transitively) loads a heavy library."""
    trees = {_module_name(p): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}
    heavy: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, tree in trees.items():
            if name not in heavy and any(i.split(".")[0] in HEAVY_LIBRARIES or i in heavy
                                         or i.rsplit(".", 1)[0] in heavy for i in _top_level_imports(tree)):
                heavy.add(name)
                changed = True
    return heavy


def _deferred_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of each tpu_ray import inside a function (`from pkg import submodule` names the submodule)."""
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tpu_ray"):
                    for a in node.names:
                        sub = f"{node.module}.{a.name}"
                        is_module = (PACKAGE.parent / sub.replace(".", "/")).with_suffix(".py").exists()
                        out.append((node.lineno, sub if is_module else node.module))
    return out


@pytest.mark.quick
def test_a_function_defers_only_the_import_of_a_heavy_module():
    """A tpu_ray import inside a function is for a module that loads TensorFlow, Ray, pandas... when
    imported: any other belongs at the top of the file, where a reader sees what the module uses.
    Exception: the format readers, which tpu_ray.prepare.corpus loads by name while it loads."""
    heavy = heavy_modules()
    light = [f"{p.relative_to(PACKAGE.parent)}:{line}: {target}" for p in sorted(PACKAGE.rglob("*.py"))
             if "readers" not in p.parts
             for line, target in _deferred_imports(ast.parse(p.read_text())) if target not in heavy]
    assert not light, "imports to move to the top of their file:\n" + "\n".join(light)


@pytest.mark.quick
def test_the_heavy_modules_are_the_ones_that_load_a_heavy_library():
    heavy = heavy_modules()
    assert {"tpu_ray.train.loop", "tpu_ray.config", "tpu_ray.storage", "tpu_ray.report"} <= heavy
    assert not {"tpu_ray.errors", "tpu_ray.redact", "tpu_ray.families", "tpu_ray.logs"} & heavy
