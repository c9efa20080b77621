"""Resume seek: time from building the training input pipeline at step N to its first batch.

tpu-ray's stream (`tpu_ray.train.input_position`) seeks by skipping whole shard files by their
manifest counts and reading at most one shuffle window; the baseline is the pipeline resume used
before (interleave + shuffle buffer, then `Dataset.skip(N)`), which reads every record already
trained on. Both read the same WikiText-2 shards (seq_len 128, global batch 32, shuffle window
2048), on this machine, in this run; each figure is the median of `--repeats` builds.

    python benchmarks/resume_seek.py        # a table, then one JSON line

Last line: {"seek_s_at_<N>", "skip_s_at_<N>" for N in --steps (10, 2000, 20000), "seek_ratio_2000_to_10",
"skip_over_seek_at_2000", "skip_over_seek_at_20000", "samples_per_epoch"}. The corpus is small
(WikiText-2, ~5,500 samples per epoch), so step 2,000 is only 64,000 records to skip; step 20,000
shows how the skip grows while the seek does not.
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

BATCH, WINDOW, SEED = 32, 2048, 0


def skip_pipeline(files: list[str], start_batch: int):
    """The pre-seek pipeline (as inputs.train_dataset was): the reference `skip()` resume."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(sorted(files))
    ds = ds.shuffle(len(files), seed=SEED, reshuffle_each_iteration=True).repeat()
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 16), block_length=16,
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.shuffle(WINDOW, seed=SEED + 1, reshuffle_each_iteration=True)
    ds = ds.batch(BATCH, drop_remainder=True)
    return ds.skip(start_batch) if start_batch else ds


def seek_pipeline(files: list[str], counts: dict[str, int], start_batch: int):
    import tensorflow as tf

    from tpu_ray.train.input_position import seekable_records

    mine = sorted(files)
    ds = seekable_records(mine, [counts[f] for f in mine], SEED, WINDOW, start_sample=start_batch * BATCH)
    return ds.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def first_batch_s(make) -> float:
    t0 = time.perf_counter()
    next(iter(make()))
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, nargs="+", default=[10, 2000, 20000],
                   help="resume steps; the first two are compared in the ratios")
    args = p.parse_args()
    from train_throughput import prepare

    from tpu_ray.prepare.shard_set import ShardSet

    with tempfile.TemporaryDirectory() as tmp:
        cfg = prepare(Path(tmp), 8000)
        found = ShardSet.open(cfg.shards_dir).files("train")
        files, counts = [f for f, _ in found], dict(found)
        first_batch_s(lambda: seek_pipeline(files, counts, 0))  # warm TF and the page cache
        first_batch_s(lambda: skip_pipeline(files, 0))
        rows = {}
        for step in args.steps:
            rows[step] = {
                "seek": statistics.median(first_batch_s(lambda s=step: seek_pipeline(files, counts, s))
                                          for _ in range(args.repeats)),
                "skip": statistics.median(first_batch_s(lambda s=step: skip_pipeline(files, s))
                                          for _ in range(args.repeats)),
            }
    lo, hi = args.steps[:2]
    n = sum(counts.values())
    print(f"{len(files)} shard files, {n} samples per epoch, batch {BATCH}, window {WINDOW}")
    print(f"{'resume at step':<16} {'samples skipped':>16} {'seek (s)':>10} {'skip() (s)':>11}")
    for step, r in rows.items():
        print(f"{step:<16} {step * BATCH:>16} {r['seek']:>10.3f} {r['skip']:>11.3f}")
    result = {}
    for step, r in rows.items():
        result[f"seek_s_at_{step}"] = round(r["seek"], 4)
        result[f"skip_s_at_{step}"] = round(r["skip"], 4)
    result[f"seek_ratio_{hi}_to_{lo}"] = round(rows[hi]["seek"] / rows[lo]["seek"], 3)
    result[f"skip_over_seek_at_{hi}"] = round(rows[hi]["skip"] / rows[hi]["seek"], 2)
    last = args.steps[-1]
    result[f"skip_over_seek_at_{last}"] = round(rows[last]["skip"] / rows[last]["seek"], 2)
    result["samples_per_epoch"] = n
    print(json.dumps(result))


if __name__ == "__main__":
    main()
