"""`tpu-ray doctor`: the reference guide's TPU checklist as checks, run on a CPU before paying for a TPU.

Each check prints PASS / WARN / FAIL, one line of evidence and, on FAIL, the fix:

- config, strategy: the config loads; the strategy/precision/jit settings suit the target.
- tensorflow, libtpu: one TensorFlow, the build the target needs (none, two, or a TPU build for a
  GPU fails); the libtpu TensorFlow would load here and why that one (a TPU VM with none fails).
- consistency: seq_len fits the position embeddings; tokenizer vocabulary, special ids and pad id
  agree with the model config and the shards; the manifest was made with this tokenizer.
- static shapes: the real tf.data pipeline has a fully defined element spec (drop_remainder) and
  the global batch splits evenly over the target's replicas.
- data: paths a TPU Node cannot read (local ones) fail; manifest counts, sizes and checksums match
  the files (sampled; every shard with --full).
- xla compile: the model and the real input pipeline, one full train step (forward, backward,
  optimizer) compiled with jit_compile=True on this CPU, two steps run, traced exactly once; an op
  XLA cannot compile is reported by name.
- memory, capacity plan: per-replica memory against the target's HBM, and step time, tokens/s,
  hours and chip-hours at an assumed utilization of the target's peak FLOP/s.

Nothing needs a Ray cluster or prepared data: without a tokenizer or shards the checks that need
them WARN "not prepared yet" and the pipeline is fed two small TFRecord shards of random ids.
A config that fails validation is reported as a FAIL (exit 1): diagnosing it is doctor's job.
Only an unknown --target is a usage error (exit 2).

The doctor package: targets.py (what a target offers, from tpu_ray/accelerators.py), estimates.py
(the pure arithmetic of memory and the plan), program.py (compiling the target's own program), and
this module, the checklist. Why this module is over 400 lines: it is the Doctor class, one short
method per check sharing the state the checks build up (tokenizer, manifest, reachability of
buckets); cutting it by check would scatter one report over several files.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from tpu_ray import rundir, storage, tf_install
from tpu_ray.accelerators import TPU_LIBTPU, local_tpu_chips
from tpu_ray.cluster.tpu_env import LIBTPU_CHOICE_ENV, LIBTPU_PATH_ENV, choose_libtpu, pip_libtpu_version
from tpu_ray.config import RunConfig
from tpu_ray.doctor.estimates import (GB, HBM_WARN_FRACTION, PROBE_BYTES, PROBE_FLOPS, PROBE_MAX_LAYERS,
                                      ASSUMED_UTILIZATION, Sizing, fmt_bytes, fmt_count, fmt_duration,
                                      memory_per_replica, param_count, probe_batch)
from tpu_ray.doctor.program import BuildSpec, op_origin, unsupported_ops
from tpu_ray.doctor.targets import Target, parse_target
from tpu_ray.errors import UserError
from tpu_ray.families import family
from tpu_ray.train.repeatability import guarantee

log = logging.getLogger(__name__)
PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
# A gs:// bucket that does not answer within this time is reported as unreachable, not waited on.
STORAGE_TIMEOUT_S = 8.0


@dataclass
class Check:
    name: str
    status: str
    evidence: str
    fix: str = ""


# --------------------------------------------------------------------------------------------
# Storage with a time limit (an unreachable bucket must not stall the doctor for minutes)
# --------------------------------------------------------------------------------------------
def _call_with_timeout(fn: Callable[[], Any], seconds: float) -> Any:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds:.0f}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def on_tpu_host() -> bool:
    """This machine is a TPU VM: it has TPU chips, or its runtime says its accelerator type."""
    return local_tpu_chips() > 0 or bool(os.environ.get("TPU_ACCELERATOR_TYPE"))


# --------------------------------------------------------------------------------------------
# The doctor
# --------------------------------------------------------------------------------------------
StepFactory = Callable[[], Callable[[dict], Any]]


class Doctor:
    """Runs the checks in order, printing each as it completes."""

    def __init__(self, cfg: RunConfig, target: Target, full: bool, out: TextIO | None):
        self.cfg, self.target, self.full, self.out = cfg, target, full, out
        self.checks: list[Check] = []
        self.tok: Any = None  # TokenizerInfo, when the run has a tokenizer
        self.shards: Any = None  # the ShardSet, when the run has a manifest
        self.shards_ok = False
        self._unreachable: dict[str, str] = {}
        self.branch_step = 0  # train.branch_from: the step its plan starts at (check_branch)
        self._tmp = tempfile.TemporaryDirectory(prefix="tpu-ray-doctor-")

    # -- reporting ---------------------------------------------------------------------------
    def add(self, name: str, status: str, evidence: str, fix: str = "") -> Check:
        check = Check(name, status, evidence, fix)
        self.checks.append(check)
        print(f"{status}  {name:<15} {evidence}", file=self.out, flush=True)
        if fix and status != PASS:
            print(f"{'':6}{'':<15} fix: {fix}", file=self.out, flush=True)
        return check

    @property
    def failed(self) -> bool:
        return any(c.status == FAIL for c in self.checks)

    def sizing(self) -> Sizing:
        """What the estimates read of this run (estimates.py), assembled from its sections."""
        cfg = self.cfg
        return Sizing(cfg.model, cfg.train, cfg.shard.seq_len, cfg.max_positions())

    # -- storage -----------------------------------------------------------------------------
    def probe(self, path: str) -> tuple[str, str]:
        """("exists" | "missing" | "unreachable" | "error", detail) for a local or remote path."""
        if not storage.is_remote(path):
            return ("exists" if os.path.lexists(path) else "missing"), ""  # a broken link is there, and damaged
        bucket = path.split("://", 1)[1].split("/", 1)[0]
        if bucket in self._unreachable:
            return "unreachable", self._unreachable[bucket]
        try:
            found = _call_with_timeout(lambda: storage.exists(path), STORAGE_TIMEOUT_S)
        except storage.MissingBucketError as exc:
            return "error", str(exc)
        except UserError as exc:
            self._unreachable[bucket] = str(exc)
            return "unreachable", str(exc)
        except TimeoutError as exc:
            self._unreachable[bucket] = f"gs://{bucket}: {exc}"
            return "unreachable", self._unreachable[bucket]
        return ("exists" if found else "missing"), ""

    # -- checks ------------------------------------------------------------------------------
    def check_strategy(self) -> None:
        t, tgt = self.cfg.train, self.target
        if tgt.kind == "tpu" and t.strategy in ("cpu", "gpu", "multiworker"):
            self.add("strategy", FAIL, f"train.strategy={t.strategy} would not use the {tgt.name} TPU",
                     "set train.strategy=auto (or tpu)")
        elif tgt.kind == "tpu" and t.mixed_precision == "mixed_float16":
            self.add("strategy", FAIL, "train.mixed_precision=mixed_float16 is GPU-only",
                     "use train.mixed_precision=auto (bfloat16 on TPU)")
        elif tgt.kind == "tpu" and t.jit_compile:
            self.add("strategy", WARN, "train.jit_compile=true is ignored on TPU (XLA compiles everything there)",
                     "remove train.jit_compile for TPU runs")
        elif tgt.kind == "tpu" and t.tpu_topology and t.tpu_topology != tgt.name.removesuffix("-node").removesuffix("-vm"):
            self.add("strategy", WARN, f"train.tpu_topology={t.tpu_topology} but planning for {tgt.name}",
                     f"set train.tpu_topology={tgt.name}")
        else:
            how = {"tpu": "TPUStrategy, bfloat16, XLA implicit", "gpu": "MirroredStrategy, float16, jit_compile",
                   "cpu": "default/MirroredStrategy, float32"}[tgt.kind]
            self.add("strategy", PASS, f"train.strategy={t.strategy} -> {how}")

    def check_repeatability(self) -> None:
        """What a rerun of this config on the target repeats (train/repeatability.py): the digits on a
        CPU; on a GPU or TPU only the curve, which a user comparing two runs must know first."""
        kind = self.target.kind
        if kind == "cpu":
            self.add("repeatability", PASS, guarantee(kind))
        else:
            self.add("repeatability", WARN, guarantee(kind), "compare such runs by their curves, or rerun on a CPU "
                     "to repeat the digits")

    def check_tensorflow(self) -> Check:
        """Which distribution provides `tensorflow` here (and its libtpu): none, two, or a TPU build
        for a GPU target is a FAIL anywhere; on a TPU host the wrong one is a FAIL, elsewhere (planning
        a TPU run from a laptop) a WARN."""
        found = tf_install.installed()
        tpu, gpu = self.target.kind == "tpu", self.target.kind == "gpu"
        problem = found.problem(tpu, gpu)
        if problem is None:
            return self.add("tensorflow", PASS, found.describe)
        always = len(found.providers) != 1 or gpu
        on_tpu = tpu and (bool(found.libtpu) or on_tpu_host())
        return self.add("tensorflow", FAIL if always or on_tpu else WARN, problem[0], problem[1])

    def check_libtpu(self) -> Check:
        """The libtpu TensorFlow would load here (cluster/tpu_env.choose_libtpu), named: a TPU VM with
        none is a FAIL; the image's by request, or a wheel other than the one tensorflow-tpu was built
        for, a WARN; planning a TPU run on a host without one, a WARN."""
        try:
            choice = choose_libtpu()
        except UserError as exc:
            return self.add("libtpu", FAIL, str(exc), f"unset {LIBTPU_CHOICE_ENV} to load the libtpu wheel's")
        if choice.path is None:
            if on_tpu_host():
                return self.add("libtpu", FAIL, f"this TPU VM has {choice.describe()}: TensorFlow cannot reach its "
                                f"chips", f"install with {tf_install.INSTALL_HINT}")
            if self.target.kind == "tpu":
                return self.add("libtpu", WARN, f"none here ({choice.why}); a {self.target.name} host needs the "
                                f"libtpu {TPU_LIBTPU} wheel", f"install there with {tf_install.INSTALL_HINT}")
            return self.add("libtpu", PASS, f"none ({choice.why}); a {self.target.kind} run loads none")
        exact = choice.source == "wheel" and pip_libtpu_version() == TPU_LIBTPU
        return self.add("libtpu", PASS if exact or choice.source == LIBTPU_PATH_ENV else WARN,
                        f"would load {choice.describe()}")

    def check_corpus(self) -> None:
        """The corpus sharding will read (skipped once shards exist: then it is no longer read). A Hub
        dataset is not fetched here (its stage downloads it): a WARN "not checked", never a PASS."""
        from tpu_ray.config import BUILTIN_CORPUS
        from tpu_ray.prepare.preflight import preflight_corpus

        if self.shards is not None:
            self.add("corpus", PASS, "shards exist; the corpus is not read again")
            return
        mixture = self.cfg.corpus.sources is not None
        fields = {(f"corpus.sources.{n}.{k}" if mixture else f"corpus.{k}"): where
                  for n, src in self.cfg.corpus.named_sources().items()
                  for k in ("source", "validation_source") if (where := getattr(src, k))}
        files = {f: w for f, w in fields.items() if w != BUILTIN_CORPUS and not w.startswith("hf:")}
        hub = {f: w for f, w in fields.items() if w.startswith("hf:")}
        if files:
            src = ", ".join(f"{f}={w}" for f, w in files.items())
            try:
                found = _call_with_timeout(lambda: preflight_corpus(self.cfg.corpus), 4 * STORAGE_TIMEOUT_S)
            except UserError as exc:
                self.add("corpus", FAIL, str(exc), "point corpus.source (or --corpus) at existing text")
                return
            except TimeoutError as exc:
                self.add("corpus", WARN, f"{src}: not verified ({exc})")
                return
            self.add("corpus", PASS, f"{src}: {len(found)} file(s) of text")
        if BUILTIN_CORPUS in fields.values():  # it ships with Python: nothing to fetch, nothing to miss
            self.add("corpus", PASS, f"{BUILTIN_CORPUS}: CPython's documentation, present with Python")
        if hub:
            self.add("corpus", WARN, f"{', '.join(f'{f}={w}' for f, w in hub.items())}: not checked (a Hub "
                     f"dataset is downloaded by the tokenizer/shard stages)",
                     "shard where the Hub is reachable, or point the field at a copy of the dataset's files")

    def check_tokenizer(self) -> None:
        from tpu_ray.prepare.tokenizer import TOKENIZER_FILE, tokenizer_info

        cfg = self.cfg
        path = storage.join(cfg.tokenizer_dir, TOKENIZER_FILE)
        state, detail = self.probe(path)
        if state == "error":
            self.add("tokenizer", FAIL, detail, "create the bucket or fix tokenizer.path / --output-dir")
        elif state == "unreachable":
            self.add("tokenizer", WARN, f"not verified: {detail}", "run doctor where the bucket is reachable")
        elif state == "missing":
            if cfg.tokenizer.path:
                self.add("tokenizer", FAIL, f"tokenizer.path={cfg.tokenizer.path}: no {TOKENIZER_FILE} there",
                         "point tokenizer.path at a tokenizer directory, or unset it to train one")
            else:
                self.add("tokenizer", WARN, f"not prepared yet: no {path}; checks use tokenizer.vocab_size="
                         f"{cfg.tokenizer.vocab_size} and tpu-ray's special ids")
        else:
            try:
                self.tok = tokenizer_info(cfg.tokenizer_dir)
            except UserError as exc:
                self.add("tokenizer", FAIL, str(exc), "retrain it with tpu-ray tokenizer --force")
                return
            self.add("tokenizer", PASS, f"{cfg.tokenizer_dir}: vocab {self.tok.vocab_size}, pad id "
                     f"{self.tok.pad_id}, mask id {self.tok.mask_id}, sha256 {self.tok.sha256[:12]}")

    def load_manifest(self) -> None:
        from tpu_ray.prepare.shard_set import ShardSet, manifest_path

        path = manifest_path(self.cfg.shards_dir)
        state, detail = self.probe(path)
        if state == "exists":
            try:
                self.shards = ShardSet.load(self.cfg.shards_dir)
            except UserError as exc:
                self.add("manifest", FAIL, str(exc), "delete it and rerun `tpu-ray shard`")
        elif state == "missing":  # shards without a manifest (the reference scripts'): training reads them by name
            try:
                found = ShardSet.from_names(self.cfg.shards_dir)
            except UserError as exc:
                self.add("manifest", FAIL, str(exc), "rename the shard or make shards with `tpu-ray shard`")
                return
            self.shards = found if found.entries else None
        elif state == "error":
            self.add("manifest", FAIL, detail, "create the bucket or fix shard.dir / --output-dir")
        elif state == "unreachable":
            self.add("manifest", WARN, f"not verified: {detail}", "run doctor where the bucket is reachable")

    def check_positions(self) -> None:
        cfg = self.cfg
        need, have = cfg.positions_needed(), cfg.max_positions()
        offset = need - cfg.shard.seq_len
        if need > have:
            self.add("positions", FAIL, f"shard.seq_len={cfg.shard.seq_len} needs {need} position embeddings "
                     f"({cfg.model.model_type} positions start at {offset}), model has {have}",
                     f"set model.max_position_embeddings={need} or shard.seq_len<={have - offset}")
        else:
            self.add("positions", PASS, f"seq_len {cfg.shard.seq_len} + {offset} <= max_position_embeddings {have}")

    def check_vocab(self) -> None:
        """Tokenizer vs model config vs shards: vocab size, special ids, pad id."""
        from tpu_ray.train.model import hf_config

        cfg, tok, shards = self.cfg, self.tok, self.shards
        if tok is None:
            self.add("vocab", WARN, "no tokenizer to compare with the model config (see tokenizer)")
            return
        try:
            hf = hf_config(cfg.model_spec, tok)
        except UserError as exc:  # e.g. a RoBERTa tokenizer whose pad id is not 1
            self.add("vocab", FAIL, str(exc), "retrain the tokenizer with tpu-ray tokenizer --force")
            return
        problems = []
        if hf.vocab_size != tok.vocab_size:
            problems.append(f"model vocab_size {hf.vocab_size} != tokenizer {tok.vocab_size}")
        if hf.pad_token_id != tok.pad_id:
            problems.append(f"model pad_token_id {hf.pad_token_id} != tokenizer pad id {tok.pad_id}")

        required = family(cfg.model.model_type).required_pad_id  # the registry says which types need which pad id
        if required is not None and tok.pad_id != required:
            problems.append(f"tokenizer pad id is {tok.pad_id}, TF {cfg.model.model_type} treats id {required} as padding")
        if max(tok.special_ids) >= hf.vocab_size:
            problems.append(f"special id {max(tok.special_ids)} >= vocab_size {hf.vocab_size}")
        if shards:
            problems += shards.vocab_mismatches(tok)
            biggest = self._max_shard_id()
            if biggest is not None and biggest >= hf.vocab_size:
                problems.append(f"shards hold token id {biggest} >= vocab_size {hf.vocab_size}")
        if problems:
            self.add("vocab", FAIL, "; ".join(problems),
                     "make tokenizer, shards and model agree: reshard with this tokenizer (tpu-ray shard in a "
                     "new --output-dir) or point tokenizer.path at the tokenizer the shards were made with")
            return
        self.add("vocab", PASS, f"model vocab_size {hf.vocab_size} = tokenizer; pad_token_id {hf.pad_token_id}, "
                 f"special ids {tok.special_ids} agree" + (" with the shards" if shards else ""))

    def _max_shard_id(self) -> int | None:
        """The largest token id in the first records of the sampled train shards (a cheap scan)."""
        import tensorflow as tf

        from tpu_ray.prepare.shard_set import sampled

        biggest = None
        for entry in sampled(self.shards.split_entries("train") if self.shards else [], self.full):
            local = self._local_copy(entry.path)
            if local is None:
                return None
            ds = tf.data.TFRecordDataset(local).take(256).batch(256)
            spec = {"input_ids": tf.io.VarLenFeature(tf.int64)}
            try:
                for raw in ds:
                    ids = tf.io.parse_example(raw, spec)["input_ids"].values
                    if tf.size(ids) > 0:
                        biggest = max(biggest or 0, int(tf.reduce_max(ids)))
            except tf.errors.OpError:
                return biggest  # a corrupt shard: the shards check names it
        return biggest

    def _local_copy(self, name: str) -> str | None:
        """A local path for shard `name` (copied from gs:// into the temp dir: TF's own GCS client
        cannot be pointed at an emulator or reused credentials, fsspec can)."""
        src = storage.join(self.cfg.shards_dir, name)
        if not storage.is_remote(src):
            return src if os.path.exists(src) else None
        dst = os.path.join(self._tmp.name, "copies", name)
        if not os.path.exists(dst):
            try:
                data = _call_with_timeout(lambda: storage.read_bytes(src), 4 * STORAGE_TIMEOUT_S)
            except (UserError, OSError, TimeoutError):
                return None
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            Path(dst).write_bytes(data)
        return dst

    def check_manifest_tokenizer(self) -> None:
        cfg, tok, shards = self.cfg, self.tok, self.shards
        if shards is None or tok is None or not shards.manifest:
            self.add("manifest/tok", WARN, "needs both a tokenizer and a shard manifest (see tokenizer, shards)"
                     + ("; these shards have none, so the tokenizer that made them is not recorded"
                        if shards is not None and not shards.manifest else ""))
            return
        problems = shards.mismatches(tok, cfg.shard.seq_len, cfg.tokenizer_dir)
        if problems:
            self.add("manifest/tok", FAIL, "; ".join(problems),
                     "reshard with this tokenizer and seq_len (new --output-dir), or set tokenizer.path / "
                     "shard.seq_len to what the shards were made with")
        else:
            self.add("manifest/tok", PASS, f"shards made with this tokenizer ({tok.sha256[:12]}) at seq_len "
                     f"{cfg.shard.seq_len}")

    def check_batch(self) -> None:
        gb, n = self.cfg.train.batch_size, self.target.replicas
        if gb % n:
            up = -(-gb // n) * n
            self.add("batch/replicas", FAIL, f"train.batch_size={gb} does not split over {n} replicas of "
                     f"{self.target.name}", f"use a multiple of {n}, e.g. train.batch_size={up}")
        else:
            note = ""
            if self.target.kind == "tpu" and (gb // n) % 8:
                note = " (not a multiple of 8: XLA pads the per-replica batch on TPU)"
            self.add("batch/replicas", PASS, f"global batch {gb} = {n} replicas x {gb // n}{note}")

    def check_schedule(self) -> None:
        """The learning-rate and masking curves: their shape, and what keeps them from their options'
        intent (a warm-up as long as the run never reaches the peak)."""
        from tpu_ray.train import curves

        t = self.cfg.train
        shape = curves.describe(t)
        c = curves.curve(t)
        ends = f"peak {t.learning_rate:g}, last step at {float(curves.rate(c, t.steps - 1)):.3g}"
        problems = curves.warnings(c, t.decay_steps)
        if problems:
            self.add("schedule", WARN, f"{shape}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if problems[1:]
                                                                     else ""))
        else:
            self.add("schedule", PASS, f"{shape} ({ends})")
        if t.branch_from:
            self.check_branch()
        if t.phases:
            self.check_phases()
        self.check_plan()

    def check_plan(self) -> None:
        """The run's plan (train/plan.py): its spans, each on a row, as the trainer will run them."""
        from tpu_ray.train.plan import plan

        for line in plan(self.cfg.train, self.cfg.corpus, self.cfg.paths, start=self.branch_step).rows():
            self.add("plan", PASS, line)

    def check_phases(self) -> None:
        """train.phases: the phases, their batches on this target, and each shorter phase's shards."""
        from tpu_ray.prepare.shard_set import ShardSet
        from tpu_ray.train.phases import describe, extra_lengths, spans

        n, all_spans = self.target.replicas, spans(self.cfg.train, self.cfg.shard.seq_len)
        for sp in all_spans:
            if sp.batch_size % n:
                self.add("phases", FAIL, f"train.phases[{sp.index}]: batch {sp.batch_size} does not split over {n} "
                         f"replicas of {self.target.name}", f"use a multiple of {n}")
                return
        if self.shards is not None:  # the run's shards are made: so must every phase's be
            for length in extra_lengths(self.cfg.train.phases, self.cfg.shard.seq_len):
                where = self.cfg.paths.shards_at(length)
                try:
                    sub = _call_with_timeout(lambda d=where: ShardSet.load(d), STORAGE_TIMEOUT_S)
                except (UserError, TimeoutError) as exc:
                    self.add("phases", FAIL, str(exc), "rerun `tpu-ray shard` with this config")
                    return
                if sub is None or not sub.complete or sub.seq_len != length:
                    self.add("phases", FAIL, f"{where}: no complete shards at seq_len {length}",
                             "rerun `tpu-ray shard` with this config (it cuts every phase's length in one pass)")
                    return
        self.add("phases", PASS, f"{describe(self.cfg.train, all_spans)}: one compile per phase; evaluation at seq_len "
                 f"{self.cfg.shard.seq_len}")

    def check_branch(self) -> None:
        """train.branch_from: the checkpoint it names, and whether this config may continue it."""
        from tpu_ray.resume import latest_checkpoint
        from tpu_ray.train.branch import kept_branch_point, pinned_step, resolve
        from tpu_ray.train.curves import describe

        try:
            c = kept_branch_point(self.cfg)  # the checkpoint a started branch was pinned to, as the trainer takes it
            own = latest_checkpoint(c.run_dir)
            if own is not None:  # resumed from its own checkpoints: the stable run's is not read again (it may be pruned)
                self.branch_step = pinned_step(c.train.branch_from) or 0
                self.add("branch", PASS, f"resumes its own checkpoint {own[0]} (branched from {c.train.branch_from})")
                return
            branch = resolve(c.branch_spec)
        except UserError as exc:
            self.add("branch", FAIL, str(exc))
            return
        self.branch_step = branch.step
        self.add("branch", PASS, f"from {branch.checkpoint} at step {branch.step:,} ({self.cfg.train.steps - branch.step:,} "
                 f"steps under this run's schedule: {describe(branch.train)}; no jump at the branch step)")

    def check_paths(self) -> None:
        cfg, tgt = self.cfg, self.target
        paths = {"--output-dir": cfg.run_dir, "shard.dir": cfg.shards_dir, "tokenizer": cfg.tokenizer_dir}
        local = {k: v for k, v in paths.items() if not storage.is_remote(v)}
        remote = {k: v for k, v in paths.items() if storage.is_remote(v)}
        for key, path in remote.items():
            state, detail = self.probe(path)
            if state == "error":
                self.add("data reach", FAIL, detail, "create the bucket (gsutil mb) or fix the path")
                return
            if state == "unreachable":
                self.add("data reach", WARN, f"{key} {path}: not verified from this machine ({detail[:160]})",
                         "run doctor where the bucket is reachable")
                return
        if tgt.style == "tpu-node" and local:
            names = ", ".join(f"{k}={v}" for k, v in local.items())
            self.add("data reach", FAIL, f"{tgt.name} is a TPU Node: its host reads input and writes checkpoints "
                     f"itself and reaches only gs://; local: {names}",
                     "put the run on GCS: --output-dir gs://BUCKET/RUN (and shard.dir / tokenizer.path on gs://)")
        elif tgt.kind == "tpu" and tgt.hosts > 1 and local:
            self.add("data reach", WARN, f"{tgt.name} has {tgt.hosts} hosts and each reads shards: local paths "
                     f"({', '.join(local)}) must exist on every host", "prefer gs:// for multi-host slices")
        else:
            where = "gs://" if remote and not local else ("local" if local and not remote else "local and gs://")
            self.add("data reach", PASS, f"{where} paths; {tgt.style} reads them"
                     + (" (checkpoints and shards on its own disk)" if local and tgt.kind == "tpu" else ""))

    def check_shards(self) -> None:
        """Manifest counts and per-shard sizes, checksums and record counts against the files."""
        from tpu_ray.prepare.shard_set import SHARD_FIX

        shards, shards_dir = self.shards, self.cfg.shards_dir
        if shards is None:
            if not any(c.name == "manifest" for c in self.checks):
                self.add("shards", WARN, f"not prepared yet: no {shards_dir}/manifest.json (tpu-ray shard makes it)")
            return
        if not shards.complete:
            self.add("shards", FAIL, f"{shards_dir}/manifest.json: sharding did not finish",
                     "rerun `tpu-ray shard` to resume it")
            return
        totals = shards.totals_problem()
        if totals:
            self.add("shards", FAIL, totals, "delete the shards and rerun `tpu-ray shard`")
            return
        deep = shards.deep_checked(self.full)  # at least what training checks
        try:
            _call_with_timeout(shards.sizes, 4 * STORAGE_TIMEOUT_S)  # one listing for every size
            for entry in shards.entries:
                problem = _call_with_timeout(lambda e=entry: shards.problem(e, deep=e.path in deep),
                                             4 * STORAGE_TIMEOUT_S)
                if problem:
                    self.add("shards", FAIL, problem, SHARD_FIX)
                    return
        except (UserError, TimeoutError) as exc:
            self.add("shards", WARN, f"not verified: {exc}", "run doctor where the shards are reachable")
            return
        self.shards_ok = True
        n, train = len(shards.entries), shards.split_entries("train")
        how = "all" if self.full or len(deep) == n else f"{len(deep)} sampled (--full: all)"
        if not shards.manifest:
            self.add("shards", PASS, f"{n} shards ({len(train)} train, {shards.samples('train')} train samples) "
                     f"without a manifest: record counts of {how} match their names")
            return
        self.add("shards", PASS, f"{n} shards ({len(train)} train, {shards.samples('train')} train samples) present "
                 f"with manifest sizes; sha256 + record counts of {how} match")

    # -- the input pipeline and the XLA probe ----------------------------------------------------
    def vocab_and_spec(self):
        """The tokenizer (or a synthetic one with tpu-ray's special ids) and the trainer's MaskSpec."""
        from tpu_ray.prepare.tokenizer import TokenizerInfo
        from tpu_ray.train.loop import mask_spec

        tok = self.tok or TokenizerInfo("synthetic", self.cfg.tokenizer.vocab_size, 0, 2, 1, 3, 4)
        return tok, mask_spec(self.cfg.train, self.cfg.paths, tok)

    def pipeline_files(self, batch: int) -> tuple[list[str], str]:
        """Train shard files for the probe: (up to 2 of) the run's own, else two synthetic ones."""
        if self.shards_ok and self.shards:
            names = [e.path for e in self.shards.split_entries("train")][:2]
            files = [f for f in (self._local_copy(n) for n in names) if f]
            if files:
                return files, "the run's shards"
        from tpu_ray.prepare.tfrecord import serialize_examples, write_records

        tok, _ = self.vocab_and_spec()
        seq = self.cfg.shard.seq_len
        rng = np.random.default_rng(self.cfg.seed)
        rows_per_shard = max(2 * batch, 8)
        files = []
        for i in range(2):
            rows = rng.integers(max(tok.special_ids) + 1, tok.vocab_size, size=(rows_per_shard, seq), dtype=np.int64)
            rows[:, 0], rows[:, -1] = tok.cls_id, tok.sep_id
            path = os.path.join(self._tmp.name, f"train-{i:05d}-{rows_per_shard}.tfrecord")
            with open(path, "wb") as f:
                write_records(f, serialize_examples(rows))
            files.append(path)
        return files, "2 synthetic shards of random ids"

    def dataset(self, files: list[str], batch: int):
        from tpu_ray.train.inputs import train_dataset

        _, spec = self.vocab_and_spec()
        # The shuffle buffer only changes order, not shapes: keep it small so the probe starts fast.
        return train_dataset(files, self.cfg.shard.seq_len, batch, spec, self.cfg.seed,
                             min(self.cfg.train.shuffle_buffer, 64))

    def check_static_shapes(self) -> None:
        per_replica = max(1, self.cfg.train.batch_size // self.target.replicas)
        files, _ = self.pipeline_files(1)
        spec = self.dataset(files, per_replica).element_spec
        shown = ", ".join(f"{k} {v.dtype.name}{v.shape.as_list()}" for k, v in sorted(spec.items()))
        loose = [k for k, v in spec.items() if not v.shape.is_fully_defined()]
        if loose:
            self.add("static shapes", FAIL, f"undefined dimensions in {', '.join(loose)}: {shown}",
                     "batch with drop_remainder=True and parse fixed-length features")
        else:
            self.add("static shapes", PASS, f"per-replica batch spec fully defined (drop_remainder): {shown}")

    def check_xla(self, step_factory: StepFactory | None) -> None:
        from tpu_ray.train.model import train_flops_per_token

        cfg = self.cfg
        tok, _ = self.vocab_and_spec()
        per_replica = max(1, cfg.train.batch_size // self.target.replicas)
        batch = probe_batch(self.sizing(), tok.vocab_size, per_replica)
        if batch == 0:
            need = memory_per_replica(self.sizing(), tok.vocab_size, 1, act_bytes=4)
            flops = cfg.shard.seq_len * train_flops_per_token(cfg.model, cfg.train, cfg.shard.seq_len, tok.vocab_size)
            self.add("xla compile", WARN, f"skipped: one sample at seq_len {cfg.shard.seq_len} needs "
                     f"{fmt_count(flops)} FLOP and {(need['activations'] + need['logits']) / GB:.0f} GB on this CPU "
                     f"(probe limit {fmt_count(PROBE_FLOPS)} FLOP, {PROBE_BYTES / GB:.0f} GB)",
                     "lower shard.seq_len (see memory below)")
            return
        files, source = self.pipeline_files(batch)
        layers = cfg.model.sizes()["num_hidden_layers"]
        probe_cfg = cfg.override({"model.num_hidden_layers": PROBE_MAX_LAYERS}) if layers > PROBE_MAX_LAYERS else cfg
        shape = f"[{batch}, {cfg.shard.seq_len}]"
        scaled = [f"per-replica batch {per_replica} scaled down for this CPU"] if batch < per_replica else []
        if probe_cfg is not cfg:
            scaled.append(f"{PROBE_MAX_LAYERS} of {layers} identical layers")
        note = f" ({'; '.join(scaled)})" if scaled else ""
        if step_factory is not None:  # a planted step (tests): the one-device XLA probe
            batches = iter(self.dataset(files, batch))
            self.add_xla(xla_probe(step_factory, batches), f"full train step at {shape}{note} on {source}")
            return

        p = probe_cfg
        spec = BuildSpec(p.train, p.paths, p.seed, p.model_spec)
        self.check_target_program(spec, tok, batch, files, f"{note} on {source}")

    def check_target_program(self, spec: BuildSpec, tok, batch: int, files: list[str], note: str) -> None:
        """Compile what the target runs: its precision, steps per execution, replicas (see program.py)."""
        from tpu_ray.doctor.program import Program, run_program, target_precision, target_steps_per_execution

        tgt = self.target
        program = Program(tgt.replicas, target_precision(self.cfg.train, tgt.kind),
                          target_steps_per_execution(self.cfg.train, tgt.kind), batch, self.cfg.shard.seq_len)
        result = run_program(spec, tok, program, files)
        label = f"{tgt.name} program: {program.describe()}{note}"
        if not result.get("ok"):
            message = result.get("error", "")
            ops = unsupported_ops(message)
            if ops:
                self.add("xla compile", FAIL, f"{label}: XLA cannot compile op(s) {', '.join(ops)}{op_origin(message)}",
                         "replace them with XLA-compatible TF ops inside the step (no tf.py_function, string ops "
                         "or data-dependent shapes)")
            else:
                self.add("xla compile", FAIL, f"{label}: compile failed: {message.strip()[:200]}",
                         "see the XLA rules in the guide")
            return
        if result["traces"] != 1:
            self.add("xla compile", FAIL, f"{label}: traced {result['traces']} times in 2 executions",
                     "feed fixed shapes (drop_remainder=True, fixed seq_len) and tensors, not Python numbers")
            return
        self.add("xla compile", PASS, f"{label}: compiled + executed in {result['compile_s']:.1f}s, again in "
                 f"{result['step_s']:.2f}s, traced once, loss {result['loss']:.2f}")

    def add_xla(self, result: tuple[str, str, str], label: str) -> None:
        status, evidence, fix = result
        self.add("xla compile", status, f"{label}: {evidence}" if status == PASS else evidence, fix)

    def check_memory_and_plan(self) -> None:
        from tpu_ray.train.model import train_flops_per_token
        from tpu_ray.train.phases import spans

        cfg, tgt = self.cfg, self.target
        tok, _ = self.vocab_and_spec()
        act_bytes = 2 if tgt.kind in ("tpu", "gpu") else 4
        # train.phases: the memory of the most demanding phase; the plan sums the phases' own steps.
        all_spans = spans(cfg.train, cfg.shard.seq_len)
        sz = self.sizing()
        worst = max(all_spans, key=lambda sp: sum(memory_per_replica(sz, tok.vocab_size, max(1, sp.batch_size
                                                                                               // tgt.replicas),
                                                                     act_bytes, span=sp).values()))
        gb, seq = worst.batch_size, worst.seq_len
        per_replica = max(1, gb // tgt.replicas)
        mem = memory_per_replica(sz, tok.vocab_size, per_replica, act_bytes, span=worst)
        total = sum(mem.values())
        fixed = mem["weights"] + mem["gradients"] + mem["adam"]
        per_sample = (total - fixed) / per_replica
        parts = (f"params {fmt_count(param_count(sz, tok.vocab_size))} -> weights+grads+AdamW "
                 f"{fmt_bytes(fixed)}, activations {fmt_bytes(mem['activations'])}, logits {fmt_bytes(mem['logits'])}")
        share = total / tgt.hbm_bytes
        line = (f"~{fmt_bytes(total)} per replica at batch {per_replica}x{seq} of {fmt_bytes(tgt.hbm_bytes)} "
                f"({share:.0%}): {parts}")
        fits = int((HBM_WARN_FRACTION * tgt.hbm_bytes - fixed) // per_sample) if per_sample else per_replica
        if tgt.kind == "tpu" and fits >= 8:
            fits = fits // 8 * 8  # XLA pads a TPU's per-replica batch to a multiple of 8
        fix = (f"lower the per-replica batch to <= {fits} (train.batch_size={max(fits, 0) * tgt.replicas}), "
               f"shard.seq_len, or the model size; or pick a target with more memory")
        if fits < 1:
            fix = "lower shard.seq_len or the model size, or pick a target with more memory"
        if share > 1:
            self.add("memory", FAIL, line, fix)
        elif share > HBM_WARN_FRACTION:
            self.add("memory", WARN, line + " (tight: XLA needs headroom)", fix)
        else:
            self.add("memory", PASS, line)

        from tpu_ray.train.model import measure_cpu_peak

        peak = tgt.peak or measure_cpu_peak()
        unit = "chip-hours" if tgt.kind == "tpu" else ("GPU-hours" if tgt.kind == "gpu" else "machine-hours")
        chips = tgt.chips if tgt.kind != "cpu" else 1
        parts, hours = [], 0.0
        for sp in all_spans:  # each phase at its own length, batch and FLOPs per token
            b, length = sp.batch_size, sp.seq_len
            step_s = (train_flops_per_token(cfg.model, cfg.train, cfg.shard.seq_len, tok.vocab_size, span=sp) * b * length
                      / (tgt.replicas * peak * ASSUMED_UTILIZATION))
            hours += sp.steps * step_s / 3600
            parts.append(f"~{fmt_duration(step_s)}/step, {fmt_count(b * length / step_s)} tokens/s"
                         + (f" x {sp.steps:,} steps at [{b}, {length}]" if len(all_spans) > 1 else ""))
        self.add("capacity plan", PASS,
                 f"{'; '.join(parts)} at {ASSUMED_UTILIZATION:.0%} of {tgt.replicas}x{peak / 1e12:.1f} TFLOP/s; "
                 f"{self.cfg.train.steps:,} steps = {hours:,.3g} h = "
                 f"{hours * chips:,.3g} {unit} ({chips:g} {'chips' if tgt.kind == 'tpu' else 'devices'})")

    # -- all ---------------------------------------------------------------------------------
    def run(self, step_factory: StepFactory | None = None, xla: bool = True) -> None:
        cfg = self.cfg
        s = cfg.model.sizes()
        self.add("config", PASS, f"name={cfg.name} seq_len={cfg.shard.seq_len} global_batch={cfg.train.batch_size} "
                 f"model={cfg.model.model_type}/{cfg.model.preset} (h={s['hidden_size']}, "
                 f"layers={s['num_hidden_layers']}) steps={cfg.train.steps:,}")
        self.check_strategy()
        self.check_repeatability()
        self.check_tensorflow()
        self.check_libtpu()
        if importlib.util.find_spec("tensorflow") is None:  # found, not imported: a TPU host's chips stay free
            self.add("other checks", WARN, "not run: the data, XLA and memory checks load TensorFlow",
                     "install TensorFlow (see tensorflow above), then run doctor again")
            return
        self.check_tokenizer()
        self.load_manifest()
        self.check_corpus()
        self.check_positions()
        self.check_vocab()
        self.check_manifest_tokenizer()
        self.check_paths()
        self.check_shards()
        self.check_batch()
        self.check_schedule()
        self.check_static_shapes()
        if xla:
            self.check_xla(step_factory)
        self.check_memory_and_plan()

    def close(self) -> None:
        self._tmp.cleanup()


def xla_probe(step_factory: StepFactory, batches: Iterator[dict]) -> tuple[str, str, str]:
    """Compile `step_factory()` with jit_compile=True, run two steps on `batches`, count traces.

    Returns (status, evidence, fix); an op XLA cannot compile is named in the evidence.
    """
    import tensorflow as tf

    t0 = time.perf_counter()
    try:
        step = tf.function(step_factory(), jit_compile=True)
        first = step(next(batches))
        _ = [float(x) for x in tf.reshape(first, [-1]).numpy()[:3]]
        compiled = time.perf_counter() - t0
        t1 = time.perf_counter()
        step(next(batches))
        second = time.perf_counter() - t1
    except tf.errors.OpError as exc:
        message = exc.message or str(exc)
        ops = unsupported_ops(message)
        if ops:
            return (FAIL, f"XLA cannot compile op(s) {', '.join(ops)}{op_origin(message)}",
                    "replace them with XLA-compatible TF ops inside the step (no tf.py_function, string ops or "
                    "data-dependent shapes; see the guide's three XLA rules)")
        return FAIL, f"XLA compile failed: {message.strip().splitlines()[0][:200]}", "see the XLA rules in the guide"
    traces = step.experimental_get_tracing_count()
    if traces != 1:
        return (FAIL, f"traced {traces} times in 2 steps: input shapes or Python values change between steps",
                "feed fixed shapes (batch with drop_remainder=True, fixed seq_len) and tensors, not Python numbers")
    return PASS, f"compiled + step 1 in {compiled:.1f}s, step 2 in {second:.2f}s, traced once", ""


def run_doctor(cfg: RunConfig | Callable[[], RunConfig], target: str | None = None, full: bool = False,
               out: TextIO | None = None, step_factory: StepFactory | None = None, xla: bool = True) -> int:
    """Run every check and print the report; 0 when nothing FAILs, else 1.

    `cfg` may be a loader, so a config that fails validation is reported as a FAIL check.
    `step_factory` replaces the model's train step (tests plant an op XLA cannot compile);
    `xla=False` skips the compile probe (the slow part) when only data/config checks matter.
    """
    t0 = time.monotonic()
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)  # its retry tracebacks; we report one line
    try:
        cfg = cfg() if callable(cfg) and not isinstance(cfg, RunConfig) else cfg
        rundir.refuse_misplaced_files(cfg.output_dir, cfg.shard.dir, cfg.tokenizer.path)
        if cfg.model.init_from:  # the checkpoint's architecture and sizes, as the run will use them
            from tpu_ray.train.init_from import checkpoint_fields

            cfg = cfg.override(checkpoint_fields(cfg.init_spec))
        if cfg.train.branch_from:  # the branch as the run will be: its defaults, its checkpoint, the stable run's data
            from tpu_ray.train.branch import settled, stable_data, stable_run_dir

            try:
                cfg = settled(cfg)
            except UserError:  # check_branch gives it as its FAIL row; the rest is checked on the stable run's data
                if over := stable_data(cfg.shard.dir, cfg.tokenizer.path, stable_run_dir(cfg.train.branch_from),
                                       cfg.branch_spec.extension):
                    cfg = cfg.override(over)
    except UserError as exc:
        print(f"{FAIL}  {'config':<15} {exc}", file=out, flush=True)
        print(f"{'':6}{'':<15} fix: correct the config (the message names the field)", file=out, flush=True)
        print(f"doctor: 1 FAIL, nothing else checked ({time.monotonic() - t0:.0f}s)", file=out, flush=True)
        return 1
    tgt = parse_target(target, cfg.train)
    print(f"tpu-ray doctor: run {cfg.name}, target {tgt.describe()}", file=out, flush=True)
    doctor = Doctor(cfg, tgt, full, out)
    try:
        doctor.run(step_factory, xla=xla)
    finally:
        doctor.close()
    counts = {s: sum(c.status == s for c in doctor.checks) for s in (PASS, WARN, FAIL)}
    print(f"doctor: {counts[PASS]} PASS, {counts[WARN]} WARN, {counts[FAIL]} FAIL "
          f"({time.monotonic() - t0:.0f}s)", file=out, flush=True)
    return 1 if doctor.failed else 0
