"""Shared body of the `ray job submit` entrypoints: parse --config/--output-dir/overrides, run, and
make a failure's one-line reason the last line of the job's log."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

# Jobs run from the working directory Ray ships; make the package importable from it too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpu_ray.config import RunConfig, load_run_config
from tpu_ray.errors import first_line, guarded
from tpu_ray.logs import setup_logging


def absolute_run_dir(cfg: RunConfig) -> RunConfig:
    """A relative run dir made absolute: a Ray job runs in a temporary copy of the working dir, so
    `runs/<name>` would be a path nobody can find afterwards; the log and last line now name it."""
    from tpu_ray import storage

    if storage.is_remote(cfg.run_dir) or os.path.isabs(cfg.run_dir):
        return cfg
    return cfg.override({"output_dir": os.path.abspath(cfg.run_dir)})


def main(stage: str, argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"jobs/{stage}.py")
    p.add_argument("--config", required=True, help="run config YAML")
    p.add_argument("--output-dir", help="run directory (local or gs://)")
    p.add_argument("--corpus", help="override corpus.source")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = p.parse_args(argv)
    setup_logging()

    def body() -> int:
        cfg = absolute_run_dir(load_run_config(args.config, args.output_dir, args.corpus, args.overrides))
        logging.getLogger("tpu_ray").info("%s: run directory %s", stage, cfg.run_dir)
        from tpu_ray.pipeline import Pipeline

        pipeline = Pipeline(cfg)
        if stage == "pretrain":
            pipeline.run(resume=args.resume)
        elif stage == "prepare":
            print(pipeline.prepare().line())
        elif stage == "train":
            pipeline.train(resume=args.resume)
        print(f"tpu-ray {stage}: SUCCEEDED run_dir={cfg.run_dir}", flush=True)
        return 0

    try:
        return guarded(body, sys.stdout)  # a UserError: one line, the log's last, exit 2
    except Exception as exc:  # an unexpected crash: traceback above, reason on the last line
        import traceback

        traceback.print_exc()
        print(f"tpu-ray: failed: {type(exc).__name__}: {first_line(exc)}",
              flush=True)
        return 1
