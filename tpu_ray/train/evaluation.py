"""One evaluation path: what an evaluation computes and what it writes, for the trainer's periodic
evaluation (loop_hooks.py, every train.eval_every steps) and `tpu-ray eval` (evaluate.py) alike.

Why one module: the figures (loss, accuracy, perplexity, bits per byte over each source's fixed set,
train/eval_set.py), their pooling over the training sources and the records they become were spread
over the loop, its hooks and the eval command; a new figure is now one edit of `figures`, and both
callers record the same `Evaluation` (each source's record, then the pooled one) under their kinds:
`eval_source` and `eval` for the training curve, `eval_rerun` for a rerun (never mixed with it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tpu_ray import storage
from tpu_ray.config import EvalConfig
from tpu_ray.prepare.shard_set import ShardSet

log = logging.getLogger("tpu_ray.train.loop")  # the trainer's log lines keep the trainer's name

SOURCE_KIND, POOLED_KIND = "eval_source", "eval"  # the training curve's records


@dataclass(frozen=True)
class Evaluation:
    """One evaluation at `step`: the figures pooled over the training sources (over every source when
    none of those has validation text) and each source's own (with its eval_samples)."""

    step: int
    pooled: dict[str, Any]
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The pooled figures with `step` and, under "sources", each source's (what `tpu-ray eval` returns)."""
        return {"step": self.step, **self.pooled, "sources": self.sources}

    def record(self, metrics: Any, source_kind: str = SOURCE_KIND, pooled_kind: str = POOLED_KIND,
               eval_time_s: float | None = None, **extra: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Write each source's record, then the pooled one (`extra`: fields every record carries;
        `eval_time_s`: how long the evaluation took, on the pooled record); returns (the pooled
        record, the sources' records) as written."""
        per_source = [metrics.write(source_kind, step=self.step, source=name, **fields, **extra)
                      for name, fields in self.sources.items()]
        timed = {} if eval_time_s is None else {"eval_time_s": eval_time_s}
        return metrics.write(pooled_kind, step=self.step, **self.pooled, **timed, **extra), per_source


class EvalSums(NamedTuple):
    """What an evaluation sums over masked positions, replicas and batches, in the order the eval
    step stacks it (one tensor per batch: a traced step returns one value): `figures` reads it."""

    loss: Any  # cross-entropy, nats
    correct: Any  # right predictions
    count: Any  # masked tokens scored
    nbytes: Any  # UTF-8 bytes of text of those tokens
    unscored: Any  # masked tokens beyond the predictions bound
    unknown: Any  # masked tokens whose bytes the shards do not record

    @classmethod
    def total(cls, many: Iterable[Iterable[float]]) -> EvalSums:
        """The field-by-field sum of several (a source's batches, the pooled sources)."""
        return cls(*(float(sum(column)) for column in zip(*many)))


def figures(sums: Iterable[float], identity: str, mask_prob: float) -> dict[str, Any]:
    """An evaluation's figures from its EvalSums (or the same six numbers in that order)."""
    loss_sum, correct, count, nbytes, dropped, unknown = EvalSums(*(float(x) for x in sums))
    loss = loss_sum / max(count, 1.0)
    bpb = loss_sum / math.log(2) / nbytes if nbytes and not unknown else None  # shards without bytes: none
    return {"eval_loss": loss, "eval_accuracy": correct / max(count, 1.0), "perplexity": math.exp(min(loss, 700.0)),
            "bits_per_byte": bpb, "eval_tokens": int(count),
            "eval_set": identity, "eval_mask_prob": mask_prob, "eval_unscored_targets": int(dropped)}


def evaluator(s: Any, shards: ShardSet, per_replica: int, eval_step: Callable[[Any], Any],
              train_spec: Any, ev: EvalConfig, seq_len: int) -> Callable[[int], Evaluation] | None:
    """`evaluate(step)` over every source's fixed set (train/eval_set.py) -> Evaluation, or None when
    no source has validation samples. `eval_step`: the loop's summed per-batch step; `train_spec`: the
    run's masking, which the evaluation's own rate (`ev`, the eval section) replaces (eval_set.eval_spec);
    `seq_len`: the shards' (evaluation runs at it throughout)."""
    import tensorflow as tf

    from tpu_ray.train.eval_set import eval_dataset, eval_set, eval_spec

    strategy, replicas = s.info.strategy, s.info.replicas
    contents = {storage.join(shards.directory, e.path): e.sha256 or "" for e in shards.entries}
    sets = [es for name in shards.source_names()
            if (es := eval_set(name, shards.files("validation", name), ev.samples, contents, s.tok.sha256,
                               ev.mask_prob, seq_len)) is not None]
    if not sets:
        log.warning("no evaluation: the shards hold no validation samples")
        return None
    spec = eval_spec(train_spec, ev.mask_prob, seq_len)
    datasets = {es.source: strategy.distribute_datasets_from_function(
        lambda ctx, es=es: eval_dataset(es, seq_len, per_replica, replicas, spec,
                                        ctx=None if ctx.num_input_pipelines == 1 else ctx)) for es in sets}
    pooled = [es.source for es in sets if not shards.evaluation_only(es.source)] or [es.source for es in sets]
    by_name = {es.source: es for es in sets}
    warned: set[str] = set()

    def evaluate(step: int) -> Evaluation:
        per_source = {}
        for es in sets:
            total = tf.zeros([len(EvalSums._fields)])
            for batch in datasets[es.source]:
                total += eval_step(batch)
            per_source[es.source] = EvalSums(*(float(x) for x in total.numpy()))
            if per_source[es.source].unknown and es.source not in warned:
                warned.add(es.source)
                log.warning("no bits per byte for source %r: its validation shards were written without each "
                            "token's bytes of text (before tpu-ray recorded them); write the shards again "
                            "for the figure", es.source)
        identity = hashlib.sha256(json.dumps(sorted(es.identity for es in sets if es.source in pooled)).encode())
        result = figures(EvalSums.total(per_source[n] for n in pooled), identity.hexdigest()[:16] if len(pooled) > 1
                         else by_name[pooled[0]].identity, ev.mask_prob)
        sources = {n: {**figures(v, by_name[n].identity, ev.mask_prob), "eval_samples": by_name[n].samples}
                   for n, v in per_source.items()}
        return Evaluation(step, result, sources)

    return evaluate
