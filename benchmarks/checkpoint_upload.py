"""Training step times while a checkpoint uploads in the background, against steps with no upload.

A tiny RoBERTa trains on WikiText-2 shards into a gs:// run directory (the GCS emulator of the
tests). Every upload of a checkpoint's index is slowed by `--upload-s` seconds (a storage stand-in
that sleeps, as a large checkpoint on a slow link would). The step times of the steps that ran
while an upload was in flight are compared with the median step time of a run in the same
process that never checkpoints until its last step.

    python benchmarks/checkpoint_upload.py      # a table, then one JSON line

Last line: {"step_s_no_upload", "step_s_during_upload", "during_over_no_upload", "steps_during_upload",
"upload_s"}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--upload-s", type=float, default=3.0)
    args = p.parse_args()
    from tests.gcs_emulator import running_emulator
    from train_throughput import prepare

    from tpu_ray import storage
    from tpu_ray.report import load_metrics
    from tpu_ray.train.loop import train

    uploads: list[tuple[float, float]] = []
    real_copy = storage.atomic_copy_file

    def slow_copy(src: str, dst: str) -> None:
        if dst.endswith(".index"):
            t0 = time.time()
            time.sleep(args.upload_s)
            real_copy(src, dst)
            uploads.append((t0, time.time()))
        else:
            real_copy(src, dst)

    storage.atomic_copy_file = slow_copy
    with tempfile.TemporaryDirectory() as tmp, running_emulator() as emu:
        base = prepare(Path(tmp), 8000).override({"model": {"preset": "tiny"}, "train.steps": args.steps,
                                                   "train.warmup_steps": 0})
        times = {}
        for name, every in (("no_upload", 10**6), ("upload", 20)):
            run = f"{emu.make_bucket()}/{name}"
            uploads.clear()
            train(base.override({"output_dir": run, "train.checkpoint_every": every}))
            df = load_metrics(run, kind="train")
            rec = df[df["step"] > 5]  # past tracing
            if name == "no_upload":
                times[name] = list(rec["step_time_s"])
            else:
                inflight = [(a, b) for a, b in uploads[:-1]]  # the last (final) upload is waited for
                during = rec[[any(a < t < b for a, b in inflight) for t in rec["time"]]]
                times[name] = list(during["step_time_s"])
    no_up, up = statistics.median(times["no_upload"]), statistics.median(times["upload"])
    print(f"{'steps':<36} {'count':>6} {'median step (ms)':>17}")
    print(f"{'no checkpoint upload':<36} {len(times['no_upload']):>6} {no_up * 1e3:>17.1f}")
    print(f"{f'while a {args.upload_s:.0f} s upload runs':<36} {len(times['upload']):>6} {up * 1e3:>17.1f}")
    print(json.dumps({"step_s_no_upload": round(no_up, 5), "step_s_during_upload": round(up, 5),
                      "during_over_no_upload": round(up / no_up, 3), "steps_during_upload": len(times["upload"]),
                      "upload_s": args.upload_s}))


if __name__ == "__main__":
    main()
