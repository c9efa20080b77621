#!/usr/bin/env bash
# The TPU package set, tested on CPU: a venv with the TPU extra's TensorFlow version as the CPU wheel
# (tensorflow==TPU_TENSORFLOW: the same TensorFlow as tensorflow-tpu, without libtpu), its tf-keras,
# transformers and tensorboard, and the TPU-shaped tests run on it (the program a TPU runs:
# several steps per execution, bfloat16, XLA; masking; 8 replicas and 1 device taking one step;
# checkpoints resumed; the export TensorFlow users load).
#
#   tests/tpu_set/run.sh            (make tpu-set)   venv: .venv-tpu-set (TPU_SET_VENV to move it)
#
# uv builds the venv (seconds once its cache holds the wheels): the test extra with its TensorFlow,
# tf-keras and tensorboard overridden by the TPU set's, so nothing else differs from CI's venv.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${TPU_SET_VENV:-.venv-tpu-set}"
PYTHON="${PYTHON:-python3}"
UV="${UV:-uv}"  # `make tpu-set` passes the project venv's
command -v "$UV" >/dev/null || { echo "tpu-set: needs uv (https://docs.astral.sh/uv/): pip install uv" >&2; exit 2; }
overrides="$(mktemp)"
trap 'rm -f "$overrides"' EXIT
# The set, from the one place it is chosen (tpu_ray/accelerators.py, pyproject's [tpu] extra).
"$PYTHON" - "$overrides" <<'PY'
import re, sys, tomllib
src = open("tpu_ray/accelerators.py").read()
pin = {k: re.search(rf'^{k} = "([^"]+)"', src, re.M).group(1) for k in ("TPU_TENSORFLOW", "TPU_TF_KERAS")}
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["tpu"]
lines = [f"tensorflow=={pin['TPU_TENSORFLOW']}", f"tf-keras=={pin['TPU_TF_KERAS']}"]
lines += [r for r in extra if re.match(r"(tensorboard|transformers)\b", r)]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
print("tpu-set:", ", ".join(lines))
PY
[ -x "$VENV/bin/python" ] || "$UV" venv -q --python "$PYTHON" "$VENV"
VIRTUAL_ENV="$VENV" "$UV" pip install -q --override "$overrides" -e ".[test]"
tests/compile_bytecode.sh "$VENV"
"$VENV/bin/python" -c "import tensorflow as tf, tf_keras, transformers; print('tpu-set: tensorflow', tf.__version__, \
'tf-keras', tf_keras.__version__, 'transformers', transformers.__version__)"
# Two xdist workers, as `make test` runs (tests/timing.py groups a file's tests on one worker).
# Its own durations file: a --durations-json in PYTEST_ADDOPTS (make durations' run) stays the main run's.
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -n "${JOBS:-2}" --dist loadgroup -m "slow or not slow" \
    --durations-json "$VENV/durations.json" \
    tests/test_tpu_program.py tests/test_masking.py \
    "tests/test_train.py::test_eight_cpu_replicas_take_the_same_step_as_one_device" \
    "tests/test_train.py::test_sigkill_then_resume_ends_where_an_uninterrupted_run_ends" \
    "tests/test_interop_torch.py::test_tensorflow_users_still_load_the_export_beside_model_safetensors" \
    "$@"
