"""The whole run, stage by stage: tokenizer -> shards -> train (-> export), in one run directory.

Every stage is idempotent and resumable: a finished tokenizer is reused, committed shards are
skipped, training continues from its last checkpoint with `resume=True`. The run directory
remembers the config it belongs to, so resuming with a different config fails loudly.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from tpu_ray import storage
from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError, first_line

log = logging.getLogger("tpu_ray")
CONFIG_FILE = "config.yaml"


def versions() -> dict[str, str]:
    """Versions of the libraries that shape a run's results (TF only if it is importable here)."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("tpu-ray", "tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-keras", "transformers",
                 "tokenizers", "datasets", "ray"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def prepare_run_dir(cfg: RunConfig, resume: bool) -> None:
    """Create the run directory and save the config; refuse a directory made for another config."""
    run_dir = cfg.run_dir
    saved_path = storage.join(run_dir, CONFIG_FILE)
    if storage.exists(saved_path):
        try:
            saved = RunConfig.from_dict(yaml.safe_load(storage.read_text(saved_path)) or {}, origin=saved_path)
        except UserError as exc:
            raise UserError(f"{saved_path}: cannot read the saved config ({exc}); use a new --output-dir") from None
        if saved.fingerprint() != cfg.fingerprint():
            diff = _first_difference(saved.fingerprint(), cfg.fingerprint())
            raise UserError(f"{run_dir}: this run directory belongs to a different config ({diff}); "
                            f"use a new --output-dir or the original config")
    storage.makedirs(run_dir)
    storage.atomic_write_text(saved_path, cfg.to_yaml())
    storage.atomic_write_text(storage.join(run_dir, "run_info.json"),
                              json.dumps({"versions": versions(), "resume": resume, "started": time.time()},
                                         indent=1) + "\n")


def _first_difference(a: dict, b: dict, prefix: str = "") -> str:
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            found = _first_difference(va, vb, f"{prefix}{key}.")
            if found:
                return found
        elif va != vb:
            return f"{prefix}{key}: saved {va!r}, now {vb!r}"
    return ""


def ensure_ray(cfg: RunConfig) -> None:
    """Connect to the cluster `ray.init()` finds (RAY_ADDRESS, a running local head) or start one."""
    import ray

    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"log_to_driver": True, "include_dashboard": False}
        if cfg.ray.address:
            kwargs["address"] = cfg.ray.address
        if cfg.ray.num_cpus and not cfg.ray.address:
            kwargs["num_cpus"] = cfg.ray.num_cpus
        ray.init(**kwargs)


def run_tokenizer(cfg: RunConfig, force: bool = False):
    """Train the tokenizer on the corpus (or reuse the run's / the configured one)."""
    from tpu_ray.prepare.corpus import iter_train_text, plan_units
    from tpu_ray.prepare.tokenizer import save_tokenizer, tokenizer_info, train_tokenizer

    if cfg.tokenizer.path or (not force and storage.exists(storage.join(cfg.tokenizer_dir, "tokenizer.json"))):
        info = tokenizer_info(cfg.tokenizer_dir)
        log.info("tokenizer: using %s (vocab %d, sha256 %s)", cfg.tokenizer_dir, info.vocab_size, info.sha256[:12])
        return info
    t0 = time.monotonic()
    units = plan_units(cfg.corpus, cfg.shard, cfg.run_dir)
    tok = train_tokenizer(iter_train_text(units, cfg.tokenizer.train_bytes), cfg.tokenizer)
    info = save_tokenizer(tok, cfg.tokenizer_dir, cfg.max_input_tokens())  # what the exported model takes
    log.info("tokenizer: trained %s vocab %d in %.1fs -> %s (sha256 %s)", cfg.tokenizer.kind, info.vocab_size,
             time.monotonic() - t0, cfg.tokenizer_dir, info.sha256[:12])
    return info


@dataclass
class RunResult:
    run_dir: str
    shard_summary: dict[str, Any] = field(default_factory=dict)
    train_summary: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def model_dir(self) -> str:
        return storage.join(self.run_dir, "model")


class Pipeline:
    """The whole run in-process, on whatever Ray cluster `ray.init()` finds."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg

    def run(self, resume: bool = False) -> RunResult:
        from tpu_ray.train.metrics import MetricsWriter

        from tpu_ray.prepare.verify import preflight_corpus

        cfg = self.cfg
        t0 = time.monotonic()
        preflight_corpus(cfg)  # a bad corpus fails before the run directory is written
        prepare_run_dir(cfg, resume)
        metrics = MetricsWriter(cfg.run_dir)
        result = RunResult(cfg.run_dir)
        with _stage(metrics, "tokenizer"):
            run_tokenizer(cfg)
        with _stage(metrics, "shard"):
            ensure_ray(cfg)
            from tpu_ray.prepare.shards import make_shards

            summary = make_shards(cfg)
            result.shard_summary = summary.__dict__ | {"tokens_per_s": summary.tokens_per_s}
        with _stage(metrics, "train"):
            from tpu_ray.cluster.placement import run_training

            result.train_summary = run_training(cfg, resume=resume)
        result.seconds = time.monotonic() - t0
        summary = {"run_dir": cfg.run_dir, "seconds": result.seconds, "shards": result.shard_summary,
                   **result.train_summary}
        storage.atomic_write_text(storage.join(cfg.run_dir, "summary.json"), json.dumps(summary, indent=1) + "\n")
        metrics.event("run_end", stage="run", seconds=result.seconds)
        metrics.close()
        log.info("done in %.1fs: %s", result.seconds, cfg.run_dir)
        return result


class _stage:
    """Logs and records the start and end of a stage."""

    def __init__(self, metrics, name: str):
        self.metrics, self.name = metrics, name

    def __enter__(self):
        self.t0 = time.monotonic()
        log.info("stage %s: start", self.name)
        self.metrics.event("stage_start", stage=self.name)

    def __exit__(self, exc_type, exc, tb):
        seconds = time.monotonic() - self.t0
        if exc is None:
            log.info("stage %s: done in %.1fs", self.name, seconds)
            self.metrics.event("stage_end", stage=self.name, seconds=seconds)
        else:
            self.metrics.event("stage_failed", stage=self.name, seconds=seconds, error=first_line(exc))
        return False
