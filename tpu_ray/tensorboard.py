"""Training and evaluation scalars as TensorBoard event files in `<run_dir>/tensorboard`.

`metrics.jsonl` is the source of truth; this is the same records in the form `tensorboard
--logdir RUN/tensorboard` (or a Vertex AI TensorBoard) shows live. For a gs:// run directory the
events are written to a local staging directory and uploaded through `tpu_ray.storage`, like
metrics and checkpoints (TensorFlow's own GCS client cannot use our credentials or the emulator);
each upload replaces the whole event file, which stays small (a few hundred bytes per record).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import tensorflow as tf

from tpu_ray import storage

TENSORBOARD_DIR = "tensorboard"
# Record fields that are not curves.
_NOT_SCALARS = {"kind", "time", "step", "train_traces", "eval_tokens"}


class TensorBoardWriter:
    """Scalars of each metrics record under `<kind>/<field>` (e.g. `train/loss`, `eval/perplexity`).

    Local event files are flushed per record; remote ones are uploaded by `flush()`, which
    MetricsWriter calls on its own upload cadence.
    """

    def __init__(self, run_dir: str):
        self.directory = storage.join(run_dir, TENSORBOARD_DIR)
        self.remote = storage.is_remote(self.directory)
        self._staging = tempfile.TemporaryDirectory(prefix="tpu-ray-tb-") if self.remote else None
        self._local = self._staging.name if self._staging else self.directory
        self._writer = tf.summary.create_file_writer(self._local)

    def write(self, record: dict[str, Any]) -> None:
        """Log the numeric fields of a `train` or `eval` metrics record at its step."""
        kind, step = record.get("kind"), record.get("step")
        if kind not in ("train", "eval") or step is None:
            return
        with self._writer.as_default(step=int(step)):
            for name, value in record.items():
                if name not in _NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
                    tf.summary.scalar(f"{kind}/{name}", value)
        if not self.remote:
            self._writer.flush()

    def flush(self) -> None:
        self._writer.flush()
        if self.remote:
            for name in sorted(os.listdir(self._local)):
                storage.atomic_copy_file(os.path.join(self._local, name), storage.join(self.directory, name))
