#!/usr/bin/env bash
# Finish a TPU host's install after `pip install -e "tpu-ray[tpu]"`: exactly one TensorFlow.
#
#   python3 -m pip install --user -e "$HOME/tpu-ray[tpu]"      # tensorflow-tpu + the libtpu it pins
#   bash "$HOME/tpu-ray/deploy/tpu-finish-install.sh" --user      # this script (pip options pass on)
#
# Why a script and not the extra alone: tf-keras requires the *distribution* `tensorflow`, and
# tensorflow-tpu is another distribution of the same `tensorflow/` package. pip and uv have no way to
# let one satisfy the other ("Provides-Dist" is ignored), so an extra that lists tf-keras installs both
# TensorFlows and the one unpacked last is imported. The [tpu] extra therefore has no tf-keras; this
# script
#   1. removes a plain `tensorflow` (an image's, an earlier install's) and then reinstalls
#      tensorflow-tpu's files without dependencies, since both wrote the same files and pip's
#      uninstall of one deletes them for the other;
#   2. installs tf-keras with --no-deps (its one requirement is that TensorFlow);
#   3. fails unless tensorflow-tpu alone provides `tensorflow`, with its libtpu
#      (python -m tpu_ray.tf_install --tpu, the check doctor makes too).
# Versions come from tpu_ray/accelerators.py (TPU_TENSORFLOW, TPU_TF_KERAS).
set -euo pipefail
PYTHON="${PYTHON:-python3}"
pin() { "$PYTHON" -c "from tpu_ray.accelerators import $1; print($1)"; }
tensorflow="$(pin TPU_TENSORFLOW)"
keras="$(pin TPU_TF_KERAS)"
if "$PYTHON" -m pip show -q tensorflow >/dev/null 2>&1; then
    echo "tpu-finish-install: removing the plain tensorflow distribution (tensorflow-tpu stays)"
    "$PYTHON" -m pip uninstall -y tensorflow
    "$PYTHON" -m pip install "$@" --no-deps --force-reinstall "tensorflow-tpu==$tensorflow"
fi
"$PYTHON" -m pip install "$@" --no-deps "tf-keras==$keras"
"$PYTHON" -m tpu_ray.tf_install --tpu
