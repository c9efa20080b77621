"""Training and evaluation scalars as TensorBoard event files in `<run_dir>/tensorboard`.

`metrics.jsonl` is the source of truth; this is the same records in the form `tensorboard
--logdir RUN/tensorboard` (or a Vertex AI TensorBoard) shows live. Written with tensorboard's own
Python event writer rather than `tf.summary`: no TensorFlow ops, so nothing is placed on a remote
TPU host after `connect_to_cluster`, and nothing here depends on the strategy.

For a gs:// run directory the events are written to a local staging directory and uploaded through
`tpu_ray.storage`, like metrics and checkpoints (TensorFlow's GCS client cannot use our credentials
or the emulator). An event file can only be replaced whole, so a new file is started every
ROTATE_BYTES (TensorBoard reads them all) and only files that grew are uploaded again.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar.metadata import create_summary_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util.tensor_util import make_tensor_proto

from tpu_ray import storage
from tpu_ray.rundir import TENSORBOARD_DIR

ROTATE_BYTES = 1 << 20
# What tf.summary.scalar writes: a float tensor tagged for TensorBoard's scalars plugin.
_SCALAR = create_summary_metadata(display_name="", description="")
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
        self._uploaded: dict[str, int] = {}  # staged file -> size at its last upload
        self._writer, self._current = self._new_writer()

    def _new_writer(self) -> tuple[EventFileWriter, str]:
        """A writer and the path of the event file it just created (each gets a unique name)."""
        os.makedirs(self._local, exist_ok=True)
        before = set(os.listdir(self._local))
        writer = EventFileWriter(self._local)
        (name,) = set(os.listdir(self._local)) - before
        return writer, os.path.join(self._local, name)

    def write(self, record: dict[str, Any]) -> None:
        """Log the numeric fields of a `train` or `eval` metrics record at its step."""
        kind, step = record.get("kind"), record.get("step")
        if kind not in ("train", "eval", "eval_source") or step is None:
            return
        # A source's evaluation goes under eval/<source>/ (eval/<source>/loss), one curve per source.
        prefix = f"eval/{record.get('source')}" if kind == "eval_source" else kind
        summary = summary_pb2.Summary()
        for name, value in record.items():
            if name not in _NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
                tag = name[len("eval_"):] if kind == "eval_source" and name.startswith("eval_") else name
                summary.value.add(tag=f"{prefix}/{tag}", tensor=make_tensor_proto(float(value)),
                                  metadata=_SCALAR)
        self._writer.add_event(event_pb2.Event(wall_time=record.get("time", time.time()), step=int(step),
                                               summary=summary))
        if not self.remote:
            self._writer.flush()

    def flush(self) -> None:
        self._writer.flush()
        if not self.remote:
            return
        for name in sorted(os.listdir(self._local)):
            size = os.path.getsize(os.path.join(self._local, name))
            if self._uploaded.get(name) != size:
                storage.atomic_copy_file(os.path.join(self._local, name), storage.join(self.directory, name))
                self._uploaded[name] = size
        if os.path.getsize(self._current) >= ROTATE_BYTES:
            self._writer.close()
            self._writer, self._current = self._new_writer()

    def close(self) -> None:
        self.flush()
        self._writer.close()
        if self._staging is not None:
            self._staging.cleanup()
