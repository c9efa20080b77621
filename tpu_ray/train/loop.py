"""Masked-LM training under a tf.distribute strategy, with checkpoints, resume, metrics and export.

Why about 600 lines: build, the step functions and the loop's named steps read top to
bottom as one program; the hooks' timing is hooks.py, their bodies loop_hooks.py.

Why a custom loop rather than `model.fit`: we need (1) the loss and accuracy averaged over masked
positions of the *global* batch (an all-reduced count, so 8 replicas equal 1 device), (2) the
train step's trace count and the host's input wait per interval, (3) resume at an exact step with
the same data and masks. The loop is still Keras underneath: a transformers TF model, a tf-keras
AdamW from train/optimizer.py, `steps_per_execution` steps per host round trip.

`train` is the one function here that reads the whole config: it resolves it once into what each
stage takes (the sections, RunPaths, the seed, and small specs: ModelSpec, StartSpec, LoopSpec, the
export's RunRecord) and builds the objects: the plan (train/plan.py: the spans; a run without
train.phases is one) and what each span reads (train/span_data.py) -> build -> restore_or_start.
`_train_loop` then runs every run the same way, as its steps: trainer_hooks (loop_hooks.py: log, eval,
checkpoint, snapshot: objects, each with its own every=) -> per span: train_input (the span's length,
batch, masking) -> make_train_step -> executions (hooks.py: no execution crosses a hook's or the
span's boundary) -> finish (export, summary).
"""

from __future__ import annotations

import hashlib
import logging
import math
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tensorflow as tf

from tpu_ray import rundir, storage
from tpu_ray.train import schedule as lr_schedule
from tpu_ray.train.checkpoints import CheckpointStore, CheckpointTimer
from tpu_ray.train.evaluation import EvalSums, evaluator as make_evaluator
from tpu_ray.train.generation import Generation
from tpu_ray.train.hooks import Hooks, TrainSums, executions
from tpu_ray.train.loop_hooks import HookSpec, PhaseFlops, Snapshot, recover_results, trainer_hooks
from tpu_ray.config import CorpusConfig, EvalConfig, RunConfig, RunPaths, TrainConfig
from tpu_ray.train.phases import Span
from tpu_ray.train.plan import Plan, SpanPlan, plan as plan_of
from tpu_ray.train.inputs import IGNORE, MaskSpec, masked_batches, predictions_for
from tpu_ray.errors import UserError
from tpu_ray.train.metrics import MetricsWriter
from tpu_ray.train.init_from import InitSpec, load_weights
from tpu_ray.train.model import ModelSpec, hf_config
from tpu_ray.train.export_safetensors import RunRecord, run_record, write_pytorch_files
from tpu_ray.train.optimizer import make_optimizer
from tpu_ray.prepare.shard_set import ShardSet
from tpu_ray.train.strategy import StrategyInfo, keeps_global_policy, select
from tpu_ray.prepare.tokenizer import TokenizerInfo, tokenizer_info
from tpu_ray.train.words import continuation_table, sampled_word_bound
from tpu_ray.families import family, mixed_precision_refusal

log = logging.getLogger(__name__)


def masked_sums(labels: tf.Tensor, logits: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(sum of CE, correct predictions, count) over masked positions only, with a 0/1 weight:
    no boolean indexing, so shapes stay static (XLA rule 2)."""
    logits = tf.cast(logits, tf.float32)
    weight = tf.cast(tf.not_equal(labels, IGNORE), tf.float32)
    safe = tf.where(labels == IGNORE, tf.zeros_like(labels), labels)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=safe, logits=logits)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=safe.dtype), safe), tf.float32)
    return tf.reduce_sum(ce * weight), tf.reduce_sum(correct * weight), tf.reduce_sum(weight)


@dataclass
class TrainSetup:
    """The built objects one training (or evaluation) process works on, and where its run lives; no
    config: what a stage needs from it is handed to that stage (the hooks the train section, the
    export the run's record, export_safetensors.RunRecord)."""

    run_dir: str
    tokenizer_dir: str
    keep_checkpoints: int
    info: StrategyInfo
    tok: TokenizerInfo
    model: Any
    optimizer: Any
    schedule: Any
    checkpoint: tf.train.Checkpoint
    step_var: tf.Variable
    recorded: lr_schedule.Schedule  # what `checkpoint` records of the schedule, checked and adopted on --resume


def build(t: TrainConfig, paths: RunPaths, seed: int, model_spec: ModelSpec, info: StrategyInfo,
          tok: TokenizerInfo) -> TrainSetup:
    """Model, optimizer and the checkpoint object over them, created inside the strategy's scope:
    the model from `model_spec` (train/model.py), the optimizer and schedule from the train section
    (its schedule resolved once: schedule.from_train), the initial weights and dropout from `seed`; `paths`:
    where the run's checkpoints and tokenizer are."""
    import tf_keras
    from transformers import TFAutoModelForMaskedLM

    refuse_precision(model_spec.model.model_type, info.mixed_precision)
    sch = lr_schedule.from_train(t)
    # `seed` fixes the initial weights and dropout too, not only data order and masks: an
    # uninterrupted run can be repeated exactly (after --resume only the dropout draws differ).
    tf_keras.utils.set_random_seed(seed)
    with info.strategy.scope():
        model = TFAutoModelForMaskedLM.from_config(hf_config(model_spec, tok))
        model(model.dummy_inputs, training=False)  # create the variables now, in scope
        optimizer, schedule = make_optimizer(sch, t.weight_decay)
        if info.mixed_precision == "mixed_float16":  # float16 needs loss scaling; bfloat16 does not
            optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
        # Create the slots now (legacy tf-keras optimizers otherwise make them on first apply), so a
        # restore is complete before the first step.
        optimizer._create_all_weights(model.trainable_variables)
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var, **lr_schedule.variables(sch))
    # Multi-worker: the same initial weights everywhere (above), but each worker its own dropout
    # stream, as the workers read different data (equal seeds would repeat worker 0's masks).
    worker = info.worker_index
    if worker:
        tf.random.set_seed(seed + 7919 * worker)
    return TrainSetup(paths.run_dir, paths.tokenizer_dir, t.keep_checkpoints, info, tok, model, optimizer, schedule,
                      checkpoint, step_var, sch)


def checkpoint_store(s: TrainSetup, write: bool = True) -> CheckpointStore:
    """The run's checkpoints (`<run_dir>/checkpoints`, local or gs://) for the objects of `s`."""
    # TPU only: on a TPU Node the variables live on remote TPU hosts, whose save ops cannot write
    # the client's local staging directory; this makes them send the values to the client to write.
    # Harmless on a TPU VM, where the client is the host.
    options = (tf.train.CheckpointOptions(experimental_io_device="/job:localhost")
               if s.info.kind == "tpu" else None)
    directory = rundir.checkpoints_dir(s.run_dir)
    generation = None
    if write:  # this attempt's fencing token: an older attempt still alive can no longer commit or prune
        generation = Generation(directory)
        log.info("training attempt %d of %s", generation.claim(), s.run_dir)
    return CheckpointStore(s.checkpoint, directory, s.keep_checkpoints, write=write, options=options,
                           skip_busy=s.info.kind != "multiworker",  # a collective save is never skipped
                           generation=generation)


def make_replica_grads(s: TrainSetup):
    """Per-replica `(batch, global_count) -> (grads, loss_sum, correct, count)`.

    The loss is this replica's CE sum divided by the masked-token count of the GLOBAL batch, so
    summing gradients over replicas gives exactly the single-device gradient of the global mean.
    """
    model, optimizer = s.model, s.optimizer
    scaled = hasattr(optimizer, "get_scaled_loss")

    def grads_and_sums(batch, global_count):
        with tf.GradientTape() as tape:
            loss_sum, correct, count = masked_sums(batch["mlm_labels"], mlm_logits(model, batch, training=True))
            loss = loss_sum / tf.maximum(global_count, 1.0)
            if scaled:
                loss = optimizer.get_scaled_loss(loss)
        grads = tape.gradient(loss, model.trainable_variables)
        if scaled:
            grads = optimizer.get_unscaled_gradients(grads)
        return grads, loss_sum, correct, count

    return grads_and_sums


def make_train_step(s: TrainSetup):
    """The distributed train step: one traced tf.function per run (checked via its trace count)."""
    strategy, model, optimizer = s.info.strategy, s.model, s.optimizer
    grads_and_sums = make_replica_grads(s)

    # jit_compile covers forward+backward; applying gradients stays outside XLA because under
    # MirroredStrategy it is a cross-replica merge. On TPU jit is None: XLA is implicit there.
    compiled = tf.function(grads_and_sums, jit_compile=True) if s.info.jit_compile else grads_and_sums

    def replica_step(batch):
        count = tf.reduce_sum(tf.cast(tf.not_equal(batch["mlm_labels"], IGNORE), tf.float32))
        global_count = tf.distribute.get_replica_context().all_reduce("sum", count)
        grads, loss_sum, correct, count = compiled(batch, global_count)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.stack(TrainSums(loss_sum, correct, count, unscored(batch)))

    def reduce(per_replica):
        return strategy.reduce("sum", per_replica, axis=None)

    @tf.function
    def train_step(batch):
        return reduce(strategy.run(replica_step, args=(batch,)))

    @tf.function
    def train_steps(iterator, n):
        total = tf.zeros([len(TrainSums._fields)])
        for _ in tf.range(n):
            total += reduce(strategy.run(replica_step, args=(next(iterator),)))
        return total

    return train_step, train_steps


def unscored(batch: dict[str, tf.Tensor]) -> tf.Tensor:
    """Masked pieces of the batch beyond the predictions bound (never scored); 0 for a batch made
    without the count (a test's own)."""
    if "mlm_unscored" not in batch:
        return tf.zeros([])
    return tf.reduce_sum(tf.cast(batch["mlm_unscored"], tf.float32))


def make_eval_step(s: TrainSetup):
    """Per batch, summed over replicas: the batch's train/evaluation.EvalSums, stacked in its order."""
    from tpu_ray.train.eval_set import scored_bytes

    strategy, model = s.info.strategy, s.model

    def replica_eval(batch):
        loss, correct, count = masked_sums(batch["mlm_labels"], mlm_logits(model, batch, training=False))
        nbytes, unknown = scored_bytes(batch)
        return tf.stack(EvalSums(loss, correct, count, nbytes, unscored(batch), unknown))

    @tf.function
    def eval_step(batch):
        return strategy.reduce("sum", strategy.run(replica_eval, args=(batch,)), axis=None)

    return eval_step


def mask_spec(t: TrainConfig, paths: RunPaths, tok: TokenizerInfo, span: Span | None = None) -> MaskSpec:
    """The masking of training batches (train.mask_schedule=linear: the rate moves with the step);
    `span`: a phase's length and rate (train/phases.py); None: the run's own (`paths.seq_len`,
    train.mask_prob). `paths`: the tokenizer (whole words) and the shards their bound is sampled from."""
    seq_len = paths.seq_len if span is None else span.seq_len
    mask_prob = t.mask_prob if span is None else span.mask_prob
    scheduled = t.mask_schedule == "linear" and t.mask_prob_end is not None
    words = None
    if t.whole_word_mask:  # word starts from the tokenizer's vocabulary (train/words.py)
        from tpu_ray.prepare.tokenizer import load_tokenizer_json

        words = continuation_table(load_tokenizer_json(paths.tokenizer_dir))
    # Every special token (XLM's <special0-9> too) is never masked nor drawn as a random replacement.
    specials = tuple(sorted({*tok.special_ids, *(i for i in tok.reserved_ids if i < tok.vocab_size)}))
    predictions = predictions_for(t, seq_len, mask_prob)
    if words is not None:  # the bound the corpus's own words need (long words would lose targets)
        predictions = max(predictions, sampled_word_bound(paths, t.mask_prob, words, tok, span))
    return MaskSpec(mask_prob, tok.mask_id, tok.vocab_size, specials, predictions,
                    target_ids=(tok.unk_id,), continues_word=words, mask_fraction=t.mask_token_fraction,
                    random_fraction=t.random_token_fraction, exact_count=t.mask_count == "exact",
                    mask_prob_end=t.mask_prob_end if scheduled else None, schedule_steps=t.steps)


def per_step(spec: MaskSpec, ctx: tf.distribute.InputContext) -> MaskSpec:
    """`spec` for one input pipeline: how many of its batches make one step (a masking schedule's clock)."""
    return replace(spec, batches_per_step=max(1, ctx.num_replicas_in_sync // ctx.num_input_pipelines))


def mlm_logits(model: Any, batch: dict[str, tf.Tensor], training: bool) -> tf.Tensor:
    """Vocabulary logits at `batch["mlm_positions"]` only: [batch, k, vocab].

    Runs the transformers model's encoder and its own MLM head, but projects only the gathered
    masked positions onto the vocabulary (the full model call would project every position).
    Same layers, same weights: the exported model is the ordinary TF*ForMaskedLM.

    Called unconverted by autograph (tf.autograph.experimental.do_not_convert), unless the family
    needs it (Family.autograph): transformers' TF models branch on Python values, not tensors, so
    converting their code to graph control flow only costs time, at every trace (one per span and
    per step function; benchmarks/trace_time.py measures it).
    """
    from tpu_ray.train.heads import gathered_logits

    if family(model.config.model_type).autograph:
        return gathered_logits(model, batch, training)
    return tf.autograph.experimental.do_not_convert(gathered_logits)(model, batch, training)


def open_shards(paths: RunPaths, tok: TokenizerInfo, lengths: tuple[int, ...] = ()) -> ShardSet:
    """The run's shards (`paths.shards_dir`), checked before a step is paid for: complete, made with
    this tokenizer and seq_len, present with the manifest's sizes (contents too, when small), all
    from one listing. `lengths`: train.phases' other lengths, each set (train/phases.py) checked the same way."""
    from tpu_ray.train.span_data import phase_shards

    shards = ShardSet.open(paths.shards_dir)
    shards.require_complete()
    shards.require_made_with(tok, paths.seq_len, paths.tokenizer_dir)
    if not shards.files("train"):
        raise UserError(f"{paths.shards_dir}: no train shards; run `tpu-ray shard` first")
    shards.verify()
    for length in lengths:
        phase_shards(paths, tok, length)
    return shards


def train(cfg: RunConfig, resume: bool = False, metrics: MetricsWriter | None = None) -> dict[str, Any]:
    """Train to `cfg.train.steps`, evaluating, checkpointing and exporting; returns the summary.

    The trainer's one reader of the whole config: it resolves the run, once, into what each stage
    takes (the plan, the sections, the run's paths and seed, the specs of the model, the start and
    the export's record), builds the objects they work on, and hands `_train_loop` the rest. A
    branch's config comes settled by whoever assembled the run (train/branch.settled: its defaults,
    its pinned checkpoint, the stable run's data; Pipeline does it before any stage); a fresh
    branch's checkpoint is checked against it again here, just before the restore (branch.resolve)."""
    from tpu_ray.train.mixture import mixture_of
    from tpu_ray.train.phases import extra_lengths
    from tpu_ray.train.span_data import shard_sets, span_data

    t_start = time.monotonic()
    t, paths = cfg.train, cfg.paths
    tok = tokenizer_info(paths.tokenizer_dir)
    shards = open_shards(paths, tok, extra_lengths(t.phases, paths.seq_len))
    init = cfg.init_spec
    # tf.data's DataLossError names no file: naming_corrupt_files names the shard.
    with keeps_global_policy(), shards.naming_corrupt_files(), ExitStack() as cleanup:
        info = select(t)
        if t.batch_size % info.replicas:
            raise UserError(f"train.batch_size={t.batch_size} is not divisible by the {info.replicas} replicas; "
                            f"use a multiple of {info.replicas}")
        log.info("training: %s", info.describe(t.batch_size))
        # Multi-worker: every worker runs this loop; only the chief writes metrics, checkpoints and the
        # export. The others log metrics to a scratch directory and, in CheckpointStore(write=False),
        # save into scratch (TF requires every worker to take part in a save) and restore the chief's.
        chief = info.is_chief
        if not chief:
            scratch = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="tpu-ray-worker-"))
            metrics = MetricsWriter(scratch, tensorboard=False)
        elif metrics is None:
            storage.makedirs(paths.run_dir)
            metrics = MetricsWriter.for_run(cfg)  # with the progress line, Ray's gauges, the trackers
            cleanup.callback(metrics.close)
        model_spec = cfg.model_spec
        s = build(t, paths, cfg.seed, model_spec, info, tok)
        ckpts = cleanup.enter_context(checkpoint_store(s, write=chief))
        # Each span's masking (its length and rate) is resolved once here, where the tokenizer is known.
        run_plan = plan_of(t, cfg.corpus, paths).with_masks(lambda span: mask_spec(t, paths, tok, span))
        for sp in run_plan.spans:
            if sp.batch_size % info.replicas:
                raise UserError(f"train.phases[{sp.span.index}].batch_size={sp.batch_size} is not divisible by the "
                                f"{info.replicas} replicas; use a multiple of {info.replicas}")
        data = span_data(run_plan, shard_sets(run_plan, shards, paths, tok), mixture_of(cfg.corpus, cfg.seed, shards), cfg.seed,
                         t.shuffle_buffer)
        run_mask = mask_spec(t, paths, tok)  # the run's own: the evaluation's, and the never-masked ids
        branch = None
        if t.branch_from and not ckpts.present:  # a fresh branch: the stable run's checkpoint it starts from
            from tpu_ray.train.branch import resolve

            found = resolve(cfg.branch_spec)
            if found.overrides:  # settling fills exactly these: unsettled, the run would not be the branch checked
                raise UserError(f"train.branch_from={t.branch_from}: this config is not settled as a branch "
                                f"({', '.join(sorted(found.overrides))} unfilled); train it through tpu_ray.Pipeline, "
                                f"or pass it through tpu_ray.train.branch.settled first")
            branch = BranchPoint(found.checkpoint, found.run_dir)
        bias = (OutputBias(cfg.corpus, cfg.seed, paths.seq_len, run_mask.never_masked)
                if cfg.model.output_bias == "unigram" else None)
        start_spec = StartSpec(branch, init if cfg.model.init_from else None, bias)
        start = restore_or_start(ckpts, s, metrics, resume, start_spec, shards)
        evaluate = evaluator(s, shards, t.batch_size // info.replicas, run_mask, cfg.eval, paths.seq_len)
        flops = PhaseFlops(cfg.model, t, paths.seq_len, tok.vocab_size, s.model.config)
        loop = LoopSpec(t, HookSpec.of(t), cfg.seed, run_plan, run_record(cfg),
                        frozenset(d.every for d in cfg.eval.downstream), evaluate_start=bool(cfg.model.init_from))
        return _train_loop(loop, s, ckpts, metrics, data, start, evaluate, flops.of, t_start)


@dataclass(frozen=True)
class LoopSpec:
    """What the loop reads of the run besides the objects it works on, resolved once by `train`."""

    train: TrainConfig  # steps, batch, train.checkpoint_every_minutes, train.accept_new_data_order
    hooks: HookSpec  # the hooks' grids and train.on_nan (trainer_hooks)
    seed: int  # with the step, fixes each batch's masks (train_input)
    plan: Plan  # the spans, each with its masking (Plan.with_masks)
    record: RunRecord  # what the export (and each downstream snapshot) records of the run
    snapshot_every: frozenset[int]  # eval.downstream's grids, one per task (empty: no snapshots)
    evaluate_start: bool = False  # model.init_from: a continued run's curves start at its checkpoint's evaluation


def _train_loop(spec: LoopSpec, s: TrainSetup, ckpts: CheckpointStore, metrics: MetricsWriter, data: Any,
                start: int, evaluate: Callable[[int], Any] | None, flops_of: Callable[[Span], float],
                t_start: float) -> dict[str, Any]:
    """The loop, in named steps: the hooks, then per span of the plan (a run without train.phases is
    one span) its input and step functions (one compile per span: static shapes within it) and its
    executions; the model, optimizer, step and hooks carried across; the summary. `data`: what each
    span reads (train/span_data.py); `start`: the step restore_or_start gave; `evaluate`: the
    evaluator (None: no validation samples); `flops_of`: a span's FLOPs per token (PhaseFlops)."""
    t, run_plan, info = spec.train, spec.plan, s.info
    source_samples = data.source_samples if data.mixture is not None else None
    # Multi-worker saves are collectives: every worker must save at the same steps, so by steps only.
    timer = CheckpointTimer(t.checkpoint_every_minutes if info.kind != "multiworker" else None)
    traced: list[Any] = []
    hooks = trainer_hooks(spec.hooks, s, ckpts, metrics, evaluate, lambda: sum(f.experimental_get_tracing_count() for f in traced),
                          flops_of, position=lambda step: data.positions.at(step).to_json(), timer=timer,
                          source_samples=source_samples)
    if spec.snapshot_every:  # the model at each task's grid, for the driver's fine-tuning (tpu_ray.downstream.during)
        snapshot_dir = lambda at: rundir.path(rundir.snapshot_dir(s.run_dir, at), rundir.MODEL_DIR)  # noqa: E731
        hooks.add(Snapshot(lambda at: export(s, spec.record, out=snapshot_dir(at)), info.is_chief),
                  every=spec.snapshot_every)
    train_log = hooks["log"]
    phases = ({"phases": [{"steps": sp.span.steps, "seq_len": sp.seq_len, "batch_size": sp.batch_size,
                           "mask_prob": sp.mask_prob} for sp in run_plan.spans]} if run_plan.phased else {})
    remaining = run_plan.remaining(start)  # the first even when resumed at the end: its position is checked

    step, files_read = start, []
    first = train_input(remaining[0], s, start, data.trackers[remaining[0].span.index], spec.seed)
    if ckpts.latest:  # resumed: the stored position is checked before the first step (and its event written
        # before train_start); the trackers are bound now, as the strategy built each input pipeline
        at = data.positions.check_resume(ckpts.stored_position(), start, ckpts.latest_url,
                                         t.accept_new_data_order)
        metrics.event("resume", stage="train", step=start, checkpoint=ckpts.latest_url, epoch=at.epoch,
                      sample_in_epoch=at.sample_in_epoch, samples=at.samples)
    _start_training(info, metrics, hooks, start, t.batch_size, evaluate_start=spec.evaluate_start, **phases)
    for sp in remaining:
        span = sp.span
        train_log.start_span(span)  # the train records' seq_len, batch and FLOPs follow the span
        iterator, mine = first if sp is remaining[0] else train_input(sp, s, step, data.trackers[span.index], spec.seed)
        files_read.extend(mine)
        train_step, train_steps = make_train_step(s)
        traced.extend((train_step, train_steps))
        if run_plan.phased:  # a plain run's metrics stay as they were: no phase_start
            log.info("phase %d of %d: steps %d-%d at seq_len %d, batch %d", span.index + 1, len(run_plan.spans),
                     span.start + 1, span.end, span.seq_len, span.batch_size)
            metrics.event("phase_start", stage="train", step=step, phase=span.index, seq_len=span.seq_len,
                          batch_size=span.batch_size, mask_prob=span.mask_prob, end=span.end,
                          text_read=data.text_read(span.index))
        for done in executions(step, t.steps, info.steps_per_execution, hooks,
                               make_execute(s, iterator, train_step, train_steps), stop=span.end):
            step = done.step
        hooks.force("log", step)  # a train record per span: none mixes two phases' figures
    summary = finish(s, metrics, hooks, start, step, files_read, t_start, t.batch_size, spec.record)
    summary.update(data.summary(step))  # a mixture's draws per source (and per phase)
    return summary


def _start_training(info: StrategyInfo, metrics: MetricsWriter, hooks: Hooks, start: int, global_batch: int,
                    evaluate_start: bool, **extra: Any) -> None:
    """The train_start event (with `extra` fields: a phased run's phases), then, for a continued run
    starting at step 0 (`evaluate_start`), the checkpoint's own evaluation: where its curves start;
    and the step-0 model for eval.downstream (a run starting at step 0 scores its starting model)."""
    metrics.event("train_start", stage="train", step=start, strategy=type(info.strategy).__name__,
                  device_kind=info.kind, replicas=info.replicas, global_batch=global_batch,
                  per_replica_batch=global_batch // info.replicas, precision=info.mixed_precision,
                  jit_compile=info.jit_compile, steps_per_execution=info.steps_per_execution,
                  evaluates="eval" in hooks, **extra)  # no validation samples: no evaluations to wait for
    if start == 0 and evaluate_start and "eval" in hooks:
        hooks.force("eval", 0)
    if start == 0 and Snapshot.name in hooks:  # eval.downstream scores the starting model too: the curve's baseline
        hooks.force(Snapshot.name, 0)


def refuse_precision(model_type: str, precision: str) -> None:
    """A model type that cannot train in mixed precision stops here with one line (auto on a TPU or
    GPU resolves to it too), before any model is built."""
    if why := mixed_precision_refusal(model_type, precision):
        raise UserError(why)


@dataclass(frozen=True)
class BranchPoint:
    """A fresh branch's start (train.branch_from, resolved by train/branch.resolve): the stable
    run's checkpoint and the run it belongs to."""

    checkpoint: str
    stable_run: str


@dataclass(frozen=True)
class OutputBias:
    """model.output_bias=unigram: what the head's starting bias is counted from: the training
    sources (`corpus`: their weights), the run's seed (the share of each file read), its shard
    length, and the ids never masked (the run's MaskSpec.never_masked)."""

    corpus: CorpusConfig
    seed: int
    seq_len: int
    never_masked: tuple[int, ...]


@dataclass(frozen=True)
class StartSpec:
    """Where a run without a checkpoint of its own starts, resolved once by `train`: a branch point
    (train.branch_from), the model.init_from resolution (train/init_from.InitSpec), and the unigram
    output bias, each None when the config does not ask for it. (A resumed run's schedule is checked
    against `TrainSetup.recorded`, what build made of the train section.)"""

    branch: BranchPoint | None = None
    init: InitSpec | None = None
    output_bias: OutputBias | None = None


def restore_or_start(ckpts: CheckpointStore, s: TrainSetup, metrics: MetricsWriter, resume: bool, spec: StartSpec,
                     shards: ShardSet | None = None) -> int:
    """The step to start from: 0, or the latest checkpoint's with --resume (refused without it).
    A fresh start with model.init_from loads the checkpoint's weights (optimizer and schedule fresh);
    one with train.branch_from the stable run's checkpoint whole (train/branch.py); one with
    model.output_bias=unigram sets the head's bias from `shards` (train/output_bias.py)."""
    if ckpts.started_over:  # only a half-written first checkpoint was there (logged by the store)
        metrics.event("start_over", stage="train", step=0, reason=ckpts.started_over)
    if not ckpts.present:  # any committed or complete checkpoint: a fresh start would overwrite them
        if spec.output_bias is not None and (spec.branch is not None or spec.init is not None):
            log.info("model.output_bias=unigram is for a fresh model: the head's bias is the trained one it starts from")
        if spec.branch is not None:  # a decay branched off a stable run: its checkpoint, this run's schedule
            from tpu_ray.train.branch import restore as restore_branch

            return restore_branch(spec.branch.checkpoint, spec.branch.stable_run, s, metrics)
        if spec.init is not None:
            loaded = load_weights(s.model, spec.init)
            log.info("initialised from %s", loaded)
            metrics.event("init_from", stage="train", step=0, source=spec.init.model.init_from, weights=loaded)
        elif spec.output_bias is not None:
            start_output_bias(s, shards, metrics, spec.output_bias)
        return 0
    if not resume:
        raise UserError(f"{ckpts.directory}: this run directory already has checkpoints; pass --resume "
                        f"to continue it or use a new --output-dir")
    ckpts.restore(s.checkpoint)
    lr_schedule.resume(s.checkpoint, ckpts.latest_url, s.recorded)  # checked, then what the next checkpoint records
    start = int(s.step_var.numpy())
    log.info("resumed from %s at step %d", ckpts.latest_url, start)
    return start  # the resume event is written by train_input, with the input position


def start_output_bias(s: TrainSetup, shards: ShardSet | None, metrics: MetricsWriter, bias: OutputBias) -> None:
    """model.output_bias=unigram: the head's bias at the log frequencies of the training tokens; the
    event records how many were counted and the loss a frequency-only model has on them (nats)."""
    from tpu_ray.train.output_bias import frequency_loss, set_output_bias, token_log_frequencies, training_sources

    never = bias.never_masked
    sources = training_sources(shards, bias.corpus, bias.seed) if shards is not None else {}
    log_p, counted = token_log_frequencies(sources, bias.seq_len, s.tok.vocab_size, never)
    name = set_output_bias(s.model, log_p)
    entropy = frequency_loss(log_p, never)
    log.info("output bias %s set from %d training tokens (%s): a frequency-only loss of %.3f nats", name,
             counted.tokens, counted.describe(), entropy)
    metrics.event("output_bias", stage="train", step=0, init="unigram", variable=name, tokens_counted=counted.tokens,
                  counted_over=counted.describe(), frequency_loss=round(entropy, 4))


def train_input(sp: SpanPlan, s: TrainSetup, start: int, positions: Any, seed: int) -> tuple[Any, list[str]]:
    """The distributed iterator over span `sp`'s training batches (the plan's length, batch and
    masking), positioned after `start` steps, and the list of files this process reads (filled as
    the strategy builds each input pipeline). `positions`: the span's position tracker
    (train/span_data.py): every span's source, plain, mixture or phase, gives its records from a
    step (`records(ctx, step)`). `seed`: the run's, which with the step fixes each batch's masks."""
    span, spec = sp.span, sp.mask
    gb, seq_len = span.batch_size, span.seq_len
    files_read: list[str] = []

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        records, mine = positions.records(ctx, start - span.start)  # a phase's stream starts at its start
        files_read.extend(mine)
        return masked_batches(records, seq_len, ctx.get_per_replica_batch_size(gb), per_step(spec, ctx), seed,
                              start * ctx.num_replicas_in_sync // ctx.num_input_pipelines, ctx)

    dist = s.info.strategy.distribute_datasets_from_function(dataset_fn)
    return iter(dist), files_read


def make_execute(s: TrainSetup, iterator, train_step, train_steps):
    """`execute(n)`: run n steps in one host round trip -> (sums, seconds, input wait). With
    steps_per_execution > 1 every execution (a short one at a hook boundary too) goes through the
    one traced multi-step function, so the program traces once."""
    single = s.info.steps_per_execution == 1

    def execute(n: int) -> tuple[Any, float, float]:
        t0 = time.perf_counter()
        if single:
            batch = next(iterator)
            t1 = time.perf_counter()
            sums = TrainSums(*train_step(batch).numpy())
            wait = t1 - t0
        else:
            sums = TrainSums(*train_steps(iterator, tf.constant(n)).numpy())
            wait = math.nan  # not separable from the steps inside one execution
        s.step_var.assign_add(n)
        return sums, time.perf_counter() - t0, wait

    return execute


def finish(s: TrainSetup, metrics: MetricsWriter, hooks: Hooks, start: int, step: int, files_read: list[str],
           t_start: float, global_batch: int, record: RunRecord) -> dict[str, Any]:
    """Export (chief; `record`: what it records of the run), the run summary (from the log's and the
    evaluation's own records), the train_end event."""
    info, train_log = s.info, hooks["log"]
    evaluation = hooks["eval"] if "eval" in hooks else None
    if train_log.last is None and info.is_chief:  # no step ran (resumed at its end): the results stand
        recover_results(s.run_dir, step, train_log, evaluation)
    last, finite = train_log.last or {}, train_log.last_finite or {}
    last_eval = (evaluation.last if evaluation else None) or {}
    export_dir = export(s, record, evaluation.last if evaluation else None) if info.is_chief else None
    summary = {
        "strategy": type(info.strategy).__name__, "kind": info.kind, "device": info.device,
        "replicas": info.replicas, "global_batch": global_batch, "steps": step, "resumed_from": start,
        "train_traces": last.get("train_traces"), "final_loss": finite.get("loss"),
        "final_loss_step": finite.get("step"), "diverged_at": train_log.diverged_at,
        "eval_loss": last_eval.get("eval_loss"), "eval_accuracy": last_eval.get("eval_accuracy"),
        "perplexity": last_eval.get("perplexity"), "eval_step": last_eval.get("step"),
        "train_seconds": time.monotonic() - t_start, "model_dir": export_dir,
    }
    if info.kind == "multiworker":  # what multiworker.py checks across workers
        summary.update(files_read=sorted(files_read), weights_sha256=weights_digest(s.model))
    metrics.event("train_end", stage="train", **{k: v for k, v in summary.items() if k not in ("kind", "files_read")})
    return summary


def weights_digest(model: Any) -> str:
    """sha256 of all weights in order: equal digests mean replicas/workers ended in sync."""
    digest = hashlib.sha256()
    for w in model.weights:
        digest.update(w.numpy().tobytes())
    return digest.hexdigest()


def evaluator(s: TrainSetup, shards: ShardSet, per_replica: int, mask: MaskSpec, ev: EvalConfig, seq_len: int):
    """`evaluate(step)` -> train/evaluation.Evaluation over every source's fixed set, with this
    model's eval step and the run's masking (`mask`: mask_spec of the run, no span), as the eval
    section says, at the run's shard length; None when no source has validation samples."""
    return make_evaluator(s, shards, per_replica, make_eval_step(s), mask, ev, seq_len)


def export(s: TrainSetup, record: RunRecord, last_eval: dict[str, Any] | None = None, out: str | None = None) -> str:
    """`<run_dir>/model` (or `out`): weights + config + tokenizer, loadable by pipeline("fill-mask"),
    with `record` (export_safetensors.run_record: the run's config, its digest) in the card and config.json.

    Written locally first, then replaced whole (storage.commit_dir): never old and new files mixed.
    """
    from tpu_ray.train.export import stamp_provenance

    out = out or rundir.path(s.run_dir, rundir.MODEL_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        s.model.save_pretrained(tmp)
        write_pytorch_files(tmp, s, record, last_eval)  # model.safetensors (PyTorch layout, no torch) + README.md model card
        for name in sorted(storage.listdir(s.tokenizer_dir)):
            base = name.rsplit("/", 1)[-1]
            (Path(tmp) / base).write_bytes(storage.read_bytes(storage.join(s.tokenizer_dir, base)))
        stamp_provenance(tmp, record.config_sha256, int(s.step_var.numpy()), record.start_step)
        storage.commit_dir(tmp, out, last="config.json")  # written beside, renamed into place whole
    return out
