#!/usr/bin/env bash
# Build the PyTorch virtual environments that tests/test_interop_torch.py loads an export in:
#   .venv-interop/t4: torch 2.13.0 (CPU) + transformers 4.57
#   .venv-interop/t5: torch 2.13.0 (CPU) + transformers 5.x
# No TensorFlow in either: the test proves that RUN/model outlives TensorFlow.
# Usage: tests/interop/setup_venvs.sh [DIR]   (DIR defaults to .venv-interop at the repo root;
# the test reads TPU_RAY_INTEROP_VENVS for another place; with TPU_RAY_REQUIRE_EXTRAS=1 it fails,
# rather than skips, when they are missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
root="${1:-${TPU_RAY_INTEROP_VENVS:-.venv-interop}}"
py="${PYTHON:-python3}"
build() {  # build NAME TRANSFORMERS_SPEC
    local dir="$root/$1"
    rm -rf "$dir"
    "$py" -m venv "$dir"
    "$dir/bin/pip" install -q --upgrade pip
    # torch first and pinned: a bare `torch` requirement pulls a multi-GB CUDA build.
    "$dir/bin/pip" install -q "torch==2.13.0"
    "$dir/bin/pip" install -q "$2" safetensors tokenizers numpy
    if "$dir/bin/python" -c "import tensorflow" 2>/dev/null; then
        echo "$dir: tensorflow is importable; the interop venvs must not have it" >&2; exit 1
    fi
    "$dir/bin/python" -c "import torch, transformers; print('$dir:', 'torch', torch.__version__, 'transformers', transformers.__version__)"
}
build t4 "transformers>=4.57,<4.58"
build t5 "transformers>=5,<6"
