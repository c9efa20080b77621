"""The whole run, stage by stage: tokenizer -> shards -> train (-> export), in one run directory.

Every stage is idempotent and resumable: a finished tokenizer is reused, committed shards are
skipped, training continues from its last checkpoint with `resume=True`. The run directory
remembers the config it belongs to, so resuming with a different config fails loudly.

`Pipeline` is the one stage layer: the `tpu-ray` commands, the `jobs/` entrypoints and the Python
API all call its methods (tokenizer, shard, prepare, train, eval, run), which own the checks before
a stage, the run directory's lock and config, and Ray start-up; the callers only print.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpu_ray import rundir, saved_config, storage
from tpu_ray.config import RunConfig
from tpu_ray.cluster.connect import check_ray_address, ensure_ray
from tpu_ray.errors import first_line
from tpu_ray.cluster.local import cluster_choice
from tpu_ray.families import family, training_order
from tpu_ray.logs import setup_api_logging
from tpu_ray.redact import redact

if TYPE_CHECKING:  # imported where used: the sharding side stays out of a plain `import tpu_ray.pipeline`
    from tpu_ray.prepare.given import Given
    from tpu_ray.prepare.shards import ShardJob

log = logging.getLogger("tpu_ray")
CONFIG_FILE = rundir.CONFIG_FILE  # kept for importers; rundir owns the layout


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


def command_line() -> str:
    """The command this process was started with, for the model card ("" in a notebook or REPL).

    An absolute program path (a console script such as tpu-ray) is shortened to its name."""
    argv = sys.argv or [""]
    if not argv[0] or argv[0] == "-c" or "ipykernel" in argv[0]:
        return ""
    prog = Path(argv[0]).name if Path(argv[0]).is_absolute() else argv[0]
    return shlex.join([prog, *argv[1:]])


def announce(cfg: RunConfig, stage: str, ray: bool) -> None:
    """A run's first lines: which Ray cluster it will use (started here or joined, and why), and any
    schedule that will not do what its options suggest (a warm-up longer than a shortened run), so
    that neither is found out after the run. The trainer logs the schedule again when it starts."""
    if stage in ("run", "train"):
        from tpu_ray.train.curves import curve, warnings

        for line in warnings(curve(cfg.train), cfg.train.decay_steps):
            log.warning("learning-rate schedule: %s", line)
    if not ray:
        return
    import ray as ray_module

    if not ray_module.is_initialized():
        log.info(cluster_choice(cfg.ray.address))


def training_needs_ray(cfg: RunConfig) -> bool:
    """Whether the train stage starts Ray: for any placement but an explicit local single worker, and
    for eval.downstream (its fine-tuning runs as Ray tasks)."""
    return cfg.train.placement != "local" or cfg.train.workers > 1 or bool(cfg.eval.downstream)


def run_tokenizer(cfg: RunConfig, force: bool = False):
    """Train the tokenizer on the corpus (or reuse the run's / the configured one)."""
    from tpu_ray.prepare.sources import plan_sources, tokenizer_text
    from tpu_ray.prepare.tokenizer import save_tokenizer, tokenizer_info, train_tokenizer

    if cfg.model.init_from and not cfg.tokenizer.path:  # the checkpoint's own tokenizer, validated and copied
        from functools import partial

        from tpu_ray.train.init_from import copy_tokenizer

        def plan_sample():  # the corpus sample a vocabulary extension learns from: planned only for one
            planned = plan_sources(cfg.corpus, cfg.shard, cfg.run_dir)
            return partial(tokenizer_text, planned, cfg.tokenizer.train_bytes, cfg.corpus.max_line_bytes, cfg.seed)

        return copy_tokenizer(cfg.init_spec, plan_sample, force=force)
    if cfg.tokenizer.path or (not force and storage.exists(rundir.path(cfg.tokenizer_dir, rundir.TOKENIZER_FILE))):
        info = tokenizer_info(cfg.tokenizer_dir)
        if cfg.model.init_from:  # a tokenizer given beside a checkpoint must still fit its embedding
            from tpu_ray.train.init_from import check_tokenizer

            check_tokenizer(cfg.init_spec, info,
                            cfg.tokenizer_dir, directory=cfg.tokenizer_dir)
        log.info("tokenizer: using %s (vocab %d, sha256 %s)", cfg.tokenizer_dir, info.vocab_size, info.sha256[:12])
        return info

    t0 = time.monotonic()
    fam = family(cfg.model.model_type)  # a from-scratch model's tokenizer follows its family's convention
    sample = tokenizer_text(plan_sources(cfg.corpus, cfg.shard, cfg.run_dir), cfg.tokenizer.train_bytes,
                            cfg.corpus.max_line_bytes, cfg.seed)
    tok = train_tokenizer(sample, cfg.tokenizer, fam.tokens, training_order(fam))
    info = save_tokenizer(tok, cfg.tokenizer_dir, cfg.max_input_tokens(), fam.tokens)  # what the exported model takes
    log.info("tokenizer: trained %s vocab %d in %.1fs -> %s (sha256 %s)", cfg.tokenizer.kind, info.vocab_size,
             time.monotonic() - t0, cfg.tokenizer_dir, info.sha256[:12])
    return info


def shard_job(cfg: RunConfig) -> ShardJob:
    """What the sharding stage reads of this run (prepare/shards.py), built here, where the run is
    assembled: the stage is given its sections and the figures derived from the others."""
    from tpu_ray.prepare.lengths import extra_lengths
    from tpu_ray.prepare.shards import ShardJob

    return ShardJob(cfg.corpus, cfg.shard, cfg.paths, extra_lengths(cfg.train.phases, cfg.shard.seq_len),
                    cfg.positions_needed(), cfg.max_positions(), cfg.ray.shared_filesystem)


def given_corpus(cfg: RunConfig, corpus: Any) -> tuple[RunConfig, list[Given]]:
    """`cfg` with its corpus pointed at what `Pipeline(cfg, corpus=...)` was given (prepare/given.py's
    `point`), validated again as a whole (a dict of sources must fit the rest of the config)."""
    from tpu_ray.prepare.given import point

    section, given = point(cfg.corpus, cfg.run_dir, corpus)
    return RunConfig.from_dict({**cfg.model_dump(), "corpus": section}, origin="Pipeline(corpus=...)"), given


@dataclass
class RunResult:
    run_dir: str
    shard_summary: dict[str, Any] = field(default_factory=dict)
    train_summary: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def model_dir(self) -> str:
        return rundir.path(self.run_dir, rundir.MODEL_DIR)

    def __repr__(self) -> str:  # one short line in a notebook; summary() has the numbers
        t = self.train_summary
        parts = [f"run_dir={self.run_dir!r}", f"steps={t.get('steps')}"]
        for key in ("eval_loss", "perplexity"):
            if isinstance(t.get(key), (int, float)):
                parts.append(f"{key}={t[key]:.4g}")
        return f"RunResult({', '.join(parts)}, seconds={self.seconds:.1f})"

    def summary(self) -> dict[str, Any]:
        """The run's key numbers as a flat dict (`pd.Series(result.summary())` for a table)."""
        from tpu_ray.tables import strategy_name

        t, sh = self.train_summary, self.shard_summary
        return {"run_dir": self.run_dir, "model_dir": t.get("model_dir") or self.model_dir,
                "steps": t.get("steps"), "resumed_from": t.get("resumed_from"),
                "final_loss": t.get("final_loss"), "eval_loss": t.get("eval_loss"),
                "eval_accuracy": t.get("eval_accuracy"), "perplexity": t.get("perplexity"),
                "strategy": strategy_name(t.get("strategy")), "device": t.get("device"),
                "replicas": t.get("replicas"), "global_batch": t.get("global_batch"),
                "shards": sh.get("shards"), "samples": sh.get("samples"), "tokens": sh.get("tokens"),
                "train_seconds": t.get("train_seconds"), "seconds": self.seconds}

    def metrics(self, kind: str | None = None):
        """`load_metrics(run_dir, kind)`: the run's records as a DataFrame."""
        from tpu_ray.report import load_metrics

        return load_metrics(self.run_dir, kind=kind)


class Pipeline:
    """The stage layer: every entry point (CLI, Ray job, Python API) runs a stage through here.

    Each public stage does, in this order: the read-only checks of its input (corpus preflight,
    Ray reachable), the run directory's lock (one writer), the saved-config check, and only then
    saves config.yaml and runs. So a refused command leaves the directory as it was and its
    corrected rerun is accepted, and two commands never write one directory at once.
    """

    def __init__(self, cfg: RunConfig, corpus: Any = None):
        """`corpus`: a path, or data in memory (a pandas.DataFrame, pyarrow.Table, datasets.Dataset or
        IterableDataset, ray.data.Dataset, an iterable of strings), or a dict {source name: either}
        for `corpus.sources`; data in memory is written once into RUN/corpus/ (prepare/given.py)."""
        if cfg.model.init_from:  # the checkpoint's architecture and sizes are the model's
            from tpu_ray.train.init_from import checkpoint_fields

            cfg = cfg.override(checkpoint_fields(cfg.init_spec))
        self._given: list = []
        self._downstream: list = []  # eval.downstream, checked (downstream/during.py)
        if corpus is not None:
            cfg, self._given = given_corpus(cfg, corpus)
        if cfg.train.branch_from:  # checked (continuity too) and its defaults filled before any stage (train/branch.py)
            from tpu_ray.train.branch import settled

            cfg = settled(cfg)
        self.cfg = cfg

    # --- stages ---------------------------------------------------------------------------------
    # Each stage, run alone (`tpu-ray tokenizer`, `shard`, `train`) or inside `run`, records its
    # start and end in the metrics stream and its numbers in RUN/summary.json, so `report` and
    # `metrics` show a staged run exactly as they show a `run` run.
    def tokenizer(self, force: bool = False):
        """Train (or reuse) the run's tokenizer; returns its TokenizerInfo."""
        with self._open("tokenizer", resume=True, corpus=True), self._recorded() as rec:
            return self._tokenizer(rec, force)

    def shard(self):
        """Write the TFRecord shards on Ray actors (resumes committed units); returns ShardSummary."""
        with self._open("shard", resume=True, corpus=True, ray=True), self._recorded() as rec:
            return self._shard(rec)

    def prepare(self):
        """Tokenizer then shards (the `prepare` job); returns the ShardSummary."""
        with self._open("prepare", resume=True, corpus=True, ray=True), self._recorded(announce=True) as rec:
            self._tokenizer(rec)
            return self._shard(rec)

    def train(self, resume: bool = False, force: bool = False) -> dict[str, Any]:
        """Train on the run's shards where the config and cluster say; returns the training summary.
        `force`: replace an export made from another config or checkpoint."""
        self._force_export = force
        with self._open("train", resume=resume, ray=training_needs_ray(self.cfg)), self._recorded() as rec:
            return self._train(rec, resume)

    def eval(self) -> dict[str, Any]:
        """Evaluate the last checkpoint on the validation shards; returns the eval record."""
        from tpu_ray.train.evaluate import check_eval_config, evaluate_run

        with self._lock("eval"):
            check_eval_config(self.cfg.fingerprint(), self.cfg.run_dir)
            return evaluate_run(self.cfg)

    def run(self, resume: bool = False, force: bool = False, fill_mask: str | None = None) -> RunResult:
        """Tokenizer, shards, training and export in one go (`force`: as for train). `fill_mask`: a
        sentence to predict after training, checked as early as its mask token is known: before
        anything for a tokenizer this run trains (its family's mask token), right after the
        tokenizer stage for a given one (tokenizer.path, model.init_from, a resumed run's), and
        always before Ray, the shards and the first training step."""
        self._force_export = force
        cfg = self.cfg
        t0 = time.monotonic()
        early = fill_mask is not None and _trains_own_tokenizer(cfg)
        if early:
            from tpu_ray.train.export import check_fill_mask_text

            check_fill_mask_text(fill_mask, own=family(cfg.model.model_type).tokens.mask)
        with (self._open("run", resume=resume, corpus=True, ray=True, start_ray=False),
              self._recorded(announce=True) as rec):
            result = RunResult(cfg.run_dir)
            info = self._tokenizer(rec)
            if fill_mask is not None:  # the tokenizer's own mask token, before Ray and the shards
                from tpu_ray.train.export import check_fill_mask_text

                check_fill_mask_text(fill_mask, own=info.special_tokens[4])
            ensure_ray(cfg.ray)
            if cfg.train.branch_from:  # the stable run's shards, checked by train/branch.py: none to write
                log.info("shard: reading %s (train.branch_from's, as they are)", cfg.shards_dir)
            else:
                self._shard(rec)
                result.shard_summary = rec.summary["shards"]
            result.train_summary = self._train(rec, resume)
            result.seconds = time.monotonic() - t0
            rec.update(seconds=result.seconds)  # the whole command, start-up included
            rec.metrics.event("run_end", stage="run", seconds=result.seconds)
        log.info("done in %.1fs: %s", result.seconds, cfg.run_dir)
        return result

    # --- the stages' bodies, each recorded ------------------------------------------------------
    def _tokenizer(self, rec: _Recorder, force: bool = False):
        with _stage(rec, "tokenizer"):
            info = run_tokenizer(self.cfg, force=force)
        from tpu_ray.prepare.vocabulary import summary_fields

        rec.update(tokenizer={"dir": self.cfg.tokenizer_dir, "kind": self.cfg.tokenizer.kind,
                              "vocab_size": info.vocab_size, "sha256": info.sha256,
                              **summary_fields(self.cfg.tokenizer_dir)})
        return info

    def _shard(self, rec: _Recorder):
        from tpu_ray.prepare.shards import make_shards

        with _stage(rec, "shard"):
            summary = make_shards(shard_job(self.cfg))
        rec.update(shards=summary.__dict__ | {"tokens_per_s": summary.tokens_per_s})
        return summary

    def _train(self, rec: _Recorder, resume: bool) -> dict[str, Any]:
        from tpu_ray.train.launch import launch

        with _stage(rec, "train"):
            if self._downstream:  # fine-tuned beside the training, from the snapshots it writes
                from tpu_ray.downstream.during import DuringTraining

                ensure_ray(self.cfg.ray)
                with DuringTraining(self.cfg.run_dir, self.cfg.train.steps, self._downstream):
                    summary = launch(self.cfg, resume=resume)
            else:
                summary = launch(self.cfg, resume=resume)
        rec.update(**summary)
        return summary

    @contextmanager
    def _recorded(self, announce: bool = False) -> Iterator[_Recorder]:
        """`announce`: log each stage's start and end (`run`, `prepare`); a one-stage command's own
        result line says it all."""
        from tpu_ray.train.metrics import MetricsWriter

        # A shared run directory: this writer takes a file of its own first, and every later writer
        # of the run (the trainer on another host, fine-tuning) does the same (metrics_stream.py).
        metrics = MetricsWriter(self.cfg.run_dir, shared=self.cfg.ray.shared_filesystem)
        try:
            yield _Recorder(self.cfg.run_dir, metrics, announce)
        except BaseException:
            try:  # the stage's error is the one to report, not a flush that fails after it
                metrics.close()
            except OSError:
                pass
            raise
        metrics.close()

    # --- the door every stage goes through ------------------------------------------------------
    def _write_given(self) -> None:
        """Write the in-memory sources into RUN/corpus/ once (a Ray Dataset on the cluster this
        process is connected to, or one started here); later calls check the data is the same."""
        from tpu_ray.prepare.given import write_given

        if any(g.kind == "ray.data.Dataset" for g in self._given):
            ensure_ray(self.cfg.ray)
        write_given(self.cfg.corpus, self.cfg.run_dir, self.cfg.ray.shared_filesystem, self._given)
        self._given = []  # once per Pipeline: its later stages read what was written

    def _lock(self, stage: str, directory: str | None = None):
        from tpu_ray.runlock import RunLock

        return RunLock(directory or self.cfg.run_dir, f"tpu-ray {stage}")

    @contextmanager
    def _open(self, stage: str, resume: bool, corpus: bool = False, ray: bool = False,
              start_ray: bool = True) -> Iterator[None]:
        """Checks, lock, config; the stage body runs inside (and the lock is held until it ends)."""
        from tpu_ray.resume import refuse_existing_run
        from tpu_ray.train.schedule import refuse_changed_schedule

        setup_api_logging()  # the CLI's stage and step lines (API callers too), no library start-up noise
        cfg = self.cfg
        rundir.refuse_misplaced_files(cfg.output_dir, cfg.shard.dir, cfg.tokenizer.path)
        if stage in ("run", "train"):
            refuse_existing_run(cfg.run_dir, resume)  # at once, not after Ray and TensorFlow start
            refuse_changed_schedule(cfg.run_dir, cfg.train, resume)  # likewise: not inside a training attempt
            if cfg.eval.downstream:  # each task read and its options checked: not after training
                from tpu_ray.downstream.during import check_downstream

                self._downstream = check_downstream(cfg.eval.downstream)
        from tpu_ray.prepare.preflight import preflight_corpus

        if corpus and not self._given:
            preflight_corpus(cfg.corpus)  # a bad corpus fails before the run directory is written
        if ray or self._given:
            check_ray_address(cfg.ray)
        announce(cfg, stage, ray or bool(self._given))
        with ExitStack() as held:
            held.enter_context(self._lock(stage, cfg.run_dir))
            if self._given:  # data in memory: written (or checked unchanged) under the run's lock
                self._write_given()
                if corpus:
                    preflight_corpus(cfg.corpus)
            if ray and corpus and not _same_dir(cfg.shards_dir, cfg.run_dir):
                # The shard directory has its own lock, default (RUN/shards) or explicit: another run
                # reading these shards (shard.dir=RUN/shards) is one writer too.
                held.enter_context(self._lock(stage, cfg.shards_dir))
            saved_config.check_config(cfg)  # another config is named as such, before the export's own guard
            if stage in ("run", "train"):
                from tpu_ray.train.export import config_digest, refuse_replacing_export

                refuse_replacing_export(config_digest(cfg.fingerprint()), cfg.run_dir, getattr(self, "_force_export", False))
            if cfg.model.init_from:  # the run's own copy of its checkpoint, made once (train/init_from.py)
                self.cfg = cfg = _own_init_copy(cfg)
            if ray and start_ray:
                ensure_ray(cfg.ray)
            saved_config.save_config(cfg, resume, versions(), command_line())
            yield


def _trains_own_tokenizer(cfg: RunConfig) -> bool:
    """Whether this run will train its tokenizer (so its mask token is its family's, known now)."""
    if cfg.tokenizer.path or cfg.model.init_from:
        return False
    return not storage.exists(rundir.path(cfg.tokenizer_dir, rundir.TOKENIZER_FILE))


def _same_dir(a: str, b: str) -> bool:
    if storage.is_remote(a) or storage.is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def _own_init_copy(cfg: RunConfig) -> RunConfig:
    """RUN/init made (or kept), its source and hash recorded in summary.json; the returned config
    carries model.init_sha256, so config.yaml records it too."""
    from tpu_ray.train.init_from import init_dir, own_copy

    cfg = cfg.override({"model.init_sha256": own_copy(cfg.init_spec)})
    _Recorder(cfg.run_dir, None).update(init_from={"source": cfg.model.init_from, "sha256": cfg.model.init_sha256,
                                                   "copy": init_dir(cfg.run_dir)})
    return cfg


class _Recorder:
    """A command's metrics writer and RUN/summary.json. The summary is read, updated and written
    whole (atomically) after each stage, so a later stage adds to what an earlier command wrote:
    `tokenizer`, `shard`, `train` run one by one leave the summary `run` leaves. `seconds` is the
    command's wall time for `run`, else the sum of the stages' (`stage_seconds`)."""

    def __init__(self, run_dir: str, metrics, announce: bool = False):
        self.path = rundir.path(run_dir, rundir.SUMMARY_FILE)
        self.metrics, self.announce = metrics, announce
        self.summary: dict[str, Any] = {**_read_summary(self.path), "run_dir": run_dir}

    def stage_done(self, name: str, seconds: float) -> None:
        stages = {**self.summary.get("stage_seconds", {}), name: round(seconds, 3)}
        self.update(stage_seconds=stages, seconds=sum(stages.values()))

    def update(self, **fields: Any) -> None:
        self.summary.update(fields)

        storage.atomic_write_text(self.path, redact(json.dumps(self.summary, indent=1, default=str)) + "\n")


def _read_summary(path: str) -> dict[str, Any]:
    """An earlier command's summary; one that is not a JSON object is replaced, with a warning."""
    if not storage.exists(path):
        return {}
    try:
        data = json.loads(storage.read_text(path))
    except (ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict):
        log.warning("%s is not a JSON object: replaced by this command's summary", path)
        return {}
    return data


class _stage:
    """Logs and records the start and end of a stage (in the metrics stream and the summary)."""

    def __init__(self, rec: _Recorder, name: str):
        self.rec, self.metrics, self.name = rec, rec.metrics, name

    def __enter__(self):
        self.t0 = time.monotonic()
        if self.rec.announce:
            log.info("stage %s: start", self.name)
        self.metrics.event("stage_start", stage=self.name)

    def __exit__(self, exc_type, exc, tb):
        seconds = time.monotonic() - self.t0
        if exc is None:
            if self.rec.announce:
                log.info("stage %s: done in %.1fs", self.name, seconds)
            self.metrics.event("stage_end", stage=self.name, seconds=seconds)
            self.rec.stage_done(self.name, seconds)
        else:  # best effort: the stage's own error is the one to report (a full disk fails this too)
            try:
                self.metrics.event("stage_failed", stage=self.name, seconds=seconds, error=first_line(exc))
            except OSError:
                pass
        return False
