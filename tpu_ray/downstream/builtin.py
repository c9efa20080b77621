"""The built-in task `builtin:stdlib-packages`: which standard-library package defines this docstring?

Real labelled text on every machine, no download: the first paragraph of each docstring of a class,
function or method defined in a standard-library package (email, asyncio, xml, ...), labelled by
that package. The labels come from where Python defines the object, never from a hand-written
list. The CLASSES packages with the most docstrings are kept, each cut to the smallest one's count
(sorted by the text's sha256, so the cut is deterministic), so classes are balanced and chance is
1/CLASSES. Splits by the text's sha256: 70% train, 20% validation, 10% test. Deterministic for one
Python build; another Python version gives other docstrings, which the task hash records.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import pkgutil
import sys
import warnings
from functools import lru_cache


CLASSES = 4
MIN_WORDS = 4
# Packages that are test suites, GUIs, or change the process when imported (the corpus skips the same).
_SKIP = {"idlelib", "tkinter", "turtledemo", "test", "lib2to3", "ensurepip", "venv", "pydoc_data", "distutils"}


def _docstrings(package: str) -> list[str]:
    """First paragraphs of the docstrings of what `package` and its submodules define."""
    out: list[str] = []
    spec = importlib.util.find_spec(package)
    names = [package] + sorted(info.name for info in pkgutil.walk_packages(
        spec.submodule_search_locations, package + ".", onerror=lambda _: None)
        if "__main__" not in info.name and ".test" not in info.name)
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception:  # not built here (a Windows-only module): skip
            continue
        for _, obj in sorted(vars(module).items()):
            if not (inspect.isclass(obj) or inspect.isfunction(obj)) or getattr(obj, "__module__", "") != name:
                continue
            docs = [obj.__doc__]
            if inspect.isclass(obj):
                # Only methods the package defines: transformers adds `Logger.warning_advice` to logging.
                docs += [m.__doc__ for _, m in sorted(vars(obj).items())
                         if inspect.isfunction(m) and getattr(m, "__module__", "") == name]
            out += [p for p in map(_first_paragraph, docs) if p]
    return out


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    para = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    return para if len(para.split()) >= MIN_WORDS else ""


def _packages() -> list[str]:
    found = []
    for name in sorted(getattr(sys, "stdlib_module_names", ())):
        if name.startswith("_") or name in _SKIP:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            found.append(name)
    return found


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@lru_cache(maxsize=1)
def builtin_rows() -> tuple[dict[str, list[dict]], list[str]]:
    """The task's rows per split and its label names, built from this Python's standard library
    (about 2 s); tasks.builtin_task makes them a Task (this module is a leaf: tasks imports it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules warn on import
        by_package = {p: _docstrings(p) for p in _packages()}
    owners: dict[str, set[str]] = {}
    for package, texts in by_package.items():
        for t in texts:
            owners.setdefault(t, set()).add(package)
    # A text two packages share (an inherited boilerplate docstring) has no single right label.
    unique = {p: sorted({t for t in texts if len(owners[t]) == 1}, key=_key) for p, texts in by_package.items()}
    top = sorted(unique, key=lambda p: (-len(unique[p]), p))[:CLASSES]
    per_class = min(len(unique[p]) for p in top)
    labels = sorted(top)
    splits: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for package in labels:
        for text in unique[package][:per_class]:
            bucket = int(_key(text)[:8], 16) % 10
            split = "test" if bucket == 0 else "validation" if bucket <= 2 else "train"
            splits[split].append({"text": text, "label": labels.index(package)})
    for rows in splits.values():
        rows.sort(key=lambda r: _key(r["text"]))
    return splits, labels
