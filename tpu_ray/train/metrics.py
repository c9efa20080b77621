"""The trainer's side of the metrics stream (tpu_ray.metrics_stream): its writer with the
TensorBoard mirror, and the readable log lines of its train and eval records.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

from tpu_ray import metrics_stream
from tpu_ray.progress import Plan as ProgressPlan, ProgressMirror

if TYPE_CHECKING:
    from tpu_ray.config import RunConfig

log = logging.getLogger("tpu_ray.train.metrics")


class MetricsWriter(metrics_stream.MetricsWriter):
    """The stream's writer (tpu_ray.metrics_stream) that also mirrors train and eval records into
    `<run_dir>/tensorboard` unless `tensorboard=False`. `shared`: as metrics_stream.MetricsWriter's."""

    def __init__(self, run_dir: str, remote_every_s: float = 30.0, tensorboard: bool = True, shared: bool = False,
                 mirrors: Sequence[metrics_stream.Mirror] = ()):
        super().__init__(run_dir, remote_every_s, mirror=_tensorboard if tensorboard else None, shared=shared,
                         mirrors=mirrors)

    @classmethod
    def for_run(cls, cfg: RunConfig) -> MetricsWriter:
        """The chief trainer's writer: TensorBoard, the progress line with Ray's gauges
        (tpu_ray/progress.py) and the trackers `cfg.tracking` turns on (tpu_ray/tracking), which record
        the whole config."""
        from tpu_ray.tracking.trackers import trackers  # config and yaml: only where a run is configured

        progress = ProgressMirror(ProgressPlan.of(cfg.train, cfg.shard.seq_len), cfg.name, cfg.run_dir)
        return cls(cfg.run_dir, mirrors=[progress, *trackers(cfg, cfg.run_dir, "train")])


def _tensorboard(run_dir: str) -> metrics_stream.Mirror:
    from tpu_ray.train.tensorboard import TensorBoardWriter  # imported on first use: it starts TensorFlow

    return TensorBoardWriter(run_dir)


def _num(v: Any, spec: str) -> str:
    """`v` formatted with `spec`; NaN/inf (stored as None in the JSON record) print as nan."""
    return "nan" if v is None else format(v, spec)


def train_line(r: dict) -> str:
    mfu = f" mfu={r['mfu']:.1%}" if r.get("mfu") is not None else ""
    wait = f" input_wait={r['input_wait_s'] * 1e3:.1f}ms" if r.get("input_wait_s") is not None else ""
    return (f"step {r['step']}: loss={_num(r['loss'], '.4f')} acc={_num(r['accuracy'], '.3f')} "
            f"lr={_num(r['learning_rate'], '.2e')} step_time={r['step_time_s'] * 1e3:.1f}ms "
            f"{r['samples_per_s']:.1f} samples/s {r['tokens_per_s']:,.0f} tokens/s{mfu}{wait} traces={r['train_traces']}")


def eval_line(r: dict) -> str:
    where = f" [{r['source']}]" if r.get("kind") == "eval_source" else ""
    bpb = f" bits/byte={_num(r['bits_per_byte'], '.3f')}" if r.get("bits_per_byte") is not None else ""
    return (f"eval{where} @ step {r['step']}: loss={_num(r['eval_loss'], '.4f')} acc={_num(r['eval_accuracy'], '.3f')} "
            f"perplexity={_num(r['perplexity'], '.2f')}{bpb}")
