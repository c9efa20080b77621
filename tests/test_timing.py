"""tests/timing.py's install check: a package without bytecode, where Python writes none, is named."""

from __future__ import annotations

import py_compile
import sys

import pytest

from tests.timing import uncompiled


@pytest.mark.quick
def test_a_package_without_bytecode_is_named_until_it_is_compiled(tmp_path, monkeypatch):
    package = tmp_path / "heavy_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert uncompiled(("heavy_pkg",)) == ["heavy_pkg"]
    py_compile.compile(str(package / "__init__.py"))  # what tests/compile_bytecode.sh does for each file
    assert uncompiled(("heavy_pkg",)) == []
    # Where Python writes bytecode itself, the first import pays once: nothing to say.
    (package / "__pycache__").rename(tmp_path / "gone")
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert uncompiled(("heavy_pkg",)) == []
