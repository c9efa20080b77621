"""From analytics code to two trained runs and their comparison (docs/analytics.md shows its output).

A pandas DataFrame filtered in pandas and a Ray Dataset deduplicated with Ray Data are each given
to `Pipeline(cfg, corpus=...)` (tiny settings: a few hundred KB of WikiText-2, 30 steps on a CPU),
then `tpu_ray.compare` puts the two runs side by side and `write_comparison` draws the page.

    python examples/analytics.py OUT_DIR [WIKITEXT_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import ray

from tpu_ray import Pipeline, RunConfig, compare
from tpu_ray.comparison import comparison_text, write_comparison

out = Path(sys.argv[1] if len(sys.argv) > 1 else "analytics-runs")
wikitext = Path(sys.argv[2] if len(sys.argv) > 2 else "../shared/data/wikitext-2")
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # the pipeline uses this cluster

# Analytics code holds its text in a DataFrame: one row per paragraph, with a length column.
lines = (wikitext / "valid.txt").read_text(encoding="utf-8").splitlines()[:6000]
df = pd.DataFrame({"text": [s.strip() for s in lines]})
df["chars"] = df["text"].str.len()

settings = {
    "tokenizer": {"vocab_size": 800}, "shard": {"seq_len": 64, "unit_bytes": 1 << 20},
    "model": {"preset": "tiny"}, "eval": {"samples": 64},
    "train": {"steps": 30, "batch_size": 16, "learning_rate": 1e-3, "warmup_steps": 3, "log_every": 5,
              "eval_every": 15, "checkpoint_every": 15, "placement": "local"},
}

# 1. Filtered in pandas: paragraphs, not headings or blank lines.
paragraphs = df[(df["chars"] > 80) & ~df["text"].str.startswith("=")]
cfg = RunConfig.from_dict({**settings, "name": "pandas", "output_dir": str(out / "pandas")})
first = Pipeline(cfg, corpus=paragraphs).run()

# 2. Deduplicated with Ray Data on the cluster (never collected here), at another learning rate.
# Two partitions suit this small set: the default (200) writes 200 tiny blocks, one parquet file each.
ds = ray.data.from_pandas(df[df["chars"] > 0])
deduped = ds.groupby("text", num_partitions=2).map_groups(lambda g: g.head(1), batch_format="pandas")
cfg = RunConfig.from_dict({**settings, "name": "ray", "output_dir": str(out / "ray")})
second = Pipeline(cfg.override({"train.learning_rate": 3e-3}), corpus=deduped).run()

# 3. Side by side.
runs = [first.run_dir, second.run_dir]
frame = compare(runs)
print(f"{len(paragraphs)} of {len(df)} rows kept by pandas")
for run in runs:  # what each run was given, as recorded in it (a later --resume checks it)
    given = json.loads((Path(run) / "corpus" / "corpus.given.json").read_text())
    print(f"{Path(run).name}: {given['kind']}, {given['text_rows']} rows, sha256 {given['content_sha256'][:12]}")
print(frame.groupby(["run", "kind"]).size().rename("records").reset_index()
      .assign(run=lambda f: f["run"].str.rsplit("/", n=1).str[-1]).to_string(index=False))
print("config keys that differ:", ", ".join(frame.attrs["differing"]))
print(comparison_text(runs))
page = write_comparison(runs, str(out / "compare"))["compare.html"]
print("page:", Path(page).relative_to(out.resolve()) if Path(page).is_absolute() else page)
