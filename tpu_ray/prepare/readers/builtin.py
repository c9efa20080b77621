"""The built-in corpus (`builtin:python-docs`): CPython's own documentation, present wherever Python is.

Written once into the run directory as a plain text file, then planned and read like any .txt file.
"""

from __future__ import annotations

import os
import sys
import sysconfig

from tpu_ray import storage
from tpu_ray.config import BUILTIN_CORPUS
from tpu_ray.errors import UserError
from tpu_ray.prepare.readers import register
from tpu_ray.prepare.readers.base import CorpusFile, PlanContext, SourceReader, WorkUnit

# Modules whose import has side effects (opens a browser, prints, needs a display) or that are
# test suites; left out of the built-in corpus. distutils too: setuptools replaces it with its own
# copy (a different text per setuptools version), and Python 3.12 removed it.
_SKIP_MODULES = {
    "antigravity", "this", "__hello__", "__phello__", "idlelib", "tkinter", "turtle", "turtledemo",
    "test", "lib2to3", "ensurepip", "venv", "pydoc_data", "xxsubtype", "xxlimited", "_testcapi",
    "distutils",
}


def _from_the_standard_library(module) -> bool:
    """Whether the module was loaded from the Python build itself (built in, or under its stdlib
    directories, not a site-packages): a package installed in the environment can shadow a stdlib
    name, which would make the corpus, and every run trained on it, depend on the environment."""
    where = getattr(module, "__file__", None)
    if where is None:
        return True
    path = os.path.realpath(where)
    if {"site-packages", "dist-packages"} & set(path.split(os.sep)):
        return False
    roots = {os.path.realpath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")}
    return any(path.startswith(root + os.sep) for root in roots)


def builtin_python_docs() -> str:
    """The CPython documentation as text: pydoc's topic pages plus stdlib module docstrings.

    Deterministic for a given Python build, whatever else the environment holds: topics sorted by
    name, modules sorted by name, only modules loaded from the build's own standard library.
    """
    import importlib
    import inspect

    # Ray replaces stdlib functions when imported (inspect.isgenerator): imported first, so the text
    # is the same whether or not the caller had imported it (the pipeline always has).
    import ray  # noqa: F401
    from pydoc_data.topics import topics

    parts = [topics[name].strip() for name in sorted(topics)]
    for name in sorted(getattr(sys, "stdlib_module_names", ())):
        if name.startswith("_") or name in _SKIP_MODULES:
            continue
        try:
            module = importlib.import_module(name)
        except Exception:  # not built on this platform (e.g. winreg): skip
            continue
        if not _from_the_standard_library(module):
            continue
        docs = [inspect.getdoc(module) or ""]
        for attr in sorted(getattr(module, "__all__", None) or dir(module)):
            if attr.startswith("_"):
                continue
            obj = getattr(module, attr, None)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "") == name:
                docs.append(inspect.getdoc(obj) or "")
        parts.extend(d.strip() for d in docs if d and d.strip())
    # One paragraph per line, like WikiText: blank lines inside docstrings become separators.
    lines: list[str] = []
    for part in parts:
        for para in part.split("\n\n"):
            para = " ".join(para.split())
            if para:
                lines.append(para)
    return "\n".join(lines) + "\n"


def materialize_builtin(run_dir: str) -> str:
    """Write the built-in corpus once into the run directory and return its path."""
    path = storage.join(run_dir, "corpus", "python-docs.txt")
    if not storage.exists(path):
        storage.makedirs(storage.join(run_dir, "corpus"))
        storage.atomic_write_text(path, builtin_python_docs())
    return path


@register
class BuiltinSource(SourceReader):
    def claims(self, source: str) -> bool:
        return source.startswith("builtin:")

    def listing(self, source: str, run_dir: str, field: str) -> list[CorpusFile] | None:
        from tpu_ray.prepare.corpus import list_files

        if source != BUILTIN_CORPUS:
            raise UserError(f"{field}={source!r}: unknown built-in corpus; the built-in one is '{BUILTIN_CORPUS}'")
        return list_files(materialize_builtin(run_dir), field)

    def plan(self, source: str, ctx: PlanContext) -> tuple[list[WorkUnit], list[CorpusFile]]:  # pragma: no cover
        raise AssertionError("the built-in corpus is listed as a file")
