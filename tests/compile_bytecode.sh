#!/usr/bin/env bash
# Compile a venv's installed packages to bytecode, as pip does after an install: a file that does not
# compile is skipped, as pip and uv skip it (torch ships a Python 3.12-only test module); any other
# failure fails the command. Usage: tests/compile_bytecode.sh VENV
#
# Why not uv's --compile-bytecode: its workers answer over a pipe, and one fresh install in four here
# failed there (2026-11-28: 'Bytecode compilation failed, expected ".../sklearn/cluster/tests/
# test_bicluster.py", received: ""', an intermittent uv failure others report too), failing make setup.
# Python's own compileall (a process pool) has no such pipe protocol.
set -euo pipefail
"$1/bin/python" -c 'import compileall, sysconfig
compileall.compile_dir(sysconfig.get_paths()["purelib"], quiet=2, workers=0)'
