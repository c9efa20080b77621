#!/usr/bin/env bash
# Build the PyTorch virtual environments that tests/test_interop_torch.py loads an export in:
#   .venv-interop/t4: torch 2.13.0 (CPU) + transformers 4.57
#   .venv-interop/t5: torch 2.13.0 (CPU) + transformers 5.x
# No TensorFlow in either: the test proves that RUN/model outlives TensorFlow. Each holds only what
# tests/interop/torch_side.py imports (torch, transformers, safetensors, tokenizers, numpy).
# Installed with uv (UV, else `uv` on PATH; `make interop` passes the project venv's): it links both
# venvs' files from one cache, so the second venv and every CI rebuild cost seconds, not a 2.3 GB copy.
# uv reads no pip configuration: a machine's pip find-links (PIP_FIND_LINKS, where a CPU build of
# torch lies) are passed on, or a bare torch==2.13.0 would resolve to PyPI's multi-GB CUDA build.
# Usage: tests/interop/setup_venvs.sh [DIR]   (DIR defaults to .venv-interop at the repo root;
# the test reads TPU_RAY_INTEROP_VENVS for another place; with TPU_RAY_REQUIRE_EXTRAS=1 it fails,
# rather than skips, when they are missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
root="${1:-${TPU_RAY_INTEROP_VENVS:-.venv-interop}}"
py="${PYTHON:-python3}"
uv="${UV:-uv}"
links=()
for dir in ${PIP_FIND_LINKS:-}; do links+=(--find-links "$dir"); done
build() {  # build NAME TRANSFORMERS_SPEC
    local dir="$root/$1"
    rm -rf "$dir"
    "$uv" venv -q --python "$py" "$dir"
    # torch pinned: a bare `torch` requirement pulls a multi-GB CUDA build.
    VIRTUAL_ENV="$dir" "$uv" pip install -q "${links[@]}" "torch==2.13.0" "$2" safetensors tokenizers numpy
    tests/compile_bytecode.sh "$dir"
    if "$dir/bin/python" -c "import tensorflow" 2>/dev/null; then
        echo "$dir: tensorflow is importable; the interop venvs must not have it" >&2; exit 1
    fi
    "$dir/bin/python" -c "import torch, transformers; print('$dir:', 'torch', torch.__version__, 'transformers', transformers.__version__)"
}
build t4 "transformers>=4.57,<4.58"
build t5 "transformers>=5,<6"
