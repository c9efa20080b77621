"""The trainer's gauges on Ray's metrics endpoint (tpu_ray/ray_gauges.py): the trainer's own writer
(MetricsWriter.for_run) gets train records; a Prometheus scrape of the node's export port finds
loss, throughput, step and ETA with the run's name."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

# Ray exports application metrics on its report interval (10 s, twice: worker to agent to endpoint):
# about 20 s of waiting on the suite's shared cluster.
pytestmark = pytest.mark.slow


def _scrape(port: int) -> dict[str, float]:
    """`name{...run="gauges"...} value` lines of the node's Prometheus text, by name."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(ray_tpu_ray_train_\w+)\{[^}]*run="gauges"[^}]*\} (\S+)$', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def test_the_trainer_sets_ray_gauges_that_a_prometheus_scrape_finds(tmp_path, ray_local):
    from tpu_ray.config import RunConfig
    from tpu_ray.train.metrics import MetricsWriter

    port = next(n["MetricsExportPort"] for n in ray_local.nodes() if n["Alive"])
    cfg = RunConfig().override({"name": "gauges", "output_dir": str(tmp_path), "train.steps": 40,
                                "train.eval_every": 1000, "train.batch_size": 8, "shard.seq_len": 32})
    writer = MetricsWriter.for_run(cfg)
    writer.event("train_start", stage="train", step=0)
    writer.write("train", step=10, loss=3.25, step_time_s=0.5, samples_per_s=16.0, tokens_per_s=512.0, mfu=None)
    writer.close()
    want = {"ray_tpu_ray_train_step": 10.0, "ray_tpu_ray_train_total_steps": 40.0, "ray_tpu_ray_train_loss": 3.25,
            "ray_tpu_ray_train_samples_per_second": 16.0, "ray_tpu_ray_train_tokens_per_second": 512.0,
            # 30 steps left at 0.5 s (one evaluation, at step 40, not yet timed)
            "ray_tpu_ray_train_eta_seconds": 15.0}
    deadline, found = time.monotonic() + 120, {}
    while time.monotonic() < deadline:  # Ray exports on its report interval: wait for it, assert no time
        found = _scrape(port)
        if all(k in found for k in want):
            break
        time.sleep(1)
    assert {k: found.get(k) for k in want} == want
    assert "ray_tpu_ray_train_mfu" not in found  # unknown on CPU: absent, never 0
