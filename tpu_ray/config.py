"""One typed, validated description of a run: loadable from YAML, overridable with dotted keys.

The CLI, `jobs/` entrypoints and the Python API all build this same object, so a notebook does
exactly what `tpu-ray run` does. Every invalid value fails at load time with one line naming the
field (pydantic does the checking; we only turn its report into that one line).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from tpu_ray.errors import UserError
from tpu_ray.families import EXCLUDED, FAMILIES, mixed_precision_refusal

BUILTIN_CORPUS = "builtin:python-docs"

# Special tokens in the order that puts <pad> at id 1: TF RoBERTa hard-codes padding_idx=1 for its
# position ids, so the reference order ([CLS] [SEP] <unk> <pad> [MASK]) made every [SEP] look like
# padding. Same tokens as the reference workflow, RoBERTa's id layout (<s>=0 <pad>=1 </s>=2 <unk>=3).
SPECIAL_TOKENS = ("[CLS]", "<pad>", "[SEP]", "<unk>", "[MASK]")
CLS, PAD, SEP, UNK, MASK = SPECIAL_TOKENS


INT64_MAX = 2**63 - 1


class _Section(BaseModel):
    # allow_inf_nan=False: `train.learning_rate=.inf` is refused at load, not found as a NaN loss later.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1: YAML's yes/on/true where a number is meant is a slip, not 1.
        if isinstance(v, bool):
            annotation = cls.model_fields[info.field_name].annotation
            types = set(get_args(annotation)) or {annotation}
            if bool not in types and types & {int, float}:
                raise ValueError(f"is a boolean ({str(v).lower()}; YAML also reads yes/no/on/off so), not a "
                                 f"number; give a number")
        return v

    @field_validator("*", mode="after")
    @classmethod
    def _fits_int64(cls, v: Any) -> Any:
        # Counts reach TensorFlow and numpy as int64: a larger value would crash there, not here.
        if isinstance(v, int) and not isinstance(v, bool) and not -INT64_MAX - 1 <= v <= INT64_MAX:
            raise ValueError(f"beyond int64 (at most {INT64_MAX}); use a smaller number")
        # An empty string is never a value here: it is an unset variable (`output_dir: $OUT`) or a
        # slip, and taking it as "the default" would put a run where nobody asked for it.
        if isinstance(v, str) and not v.strip():
            raise ValueError("is empty; give a value, or leave the key out for the default")
        return v


class _SourceFields(_Section):
    """Where one source's text comes from and how it is read (one-source `corpus`, or each of
    `corpus.sources`)."""

    # "builtin:python-docs", a local path, directory or glob (.txt/.jsonl/.json/.csv/.tsv, each
    # also .gz/.zst/.bz2/.xz; .parquet; a datasets save_to_disk directory), a gs:// or hf:// URI
    # or glob, or "hf:NAME" for a Hugging Face dataset (read by its data files; hf_config picks its
    # configuration, or names the files for hf:text|json|csv|parquet).
    source: str = BUILTIN_CORPUS
    hf_config: str | None = None  # the Hugging Face dataset's configuration name (hf: sources)
    hf_split: str = "train"  # the Hugging Face dataset's split (hf: sources)
    text_field: str = "text"  # the text column/key of JSON lines, parquet and datasets
    # A text field holding a list of strings: "error" (one line naming the record), or "join" its
    # items as lines. Other non-string values are always an error; null/missing are skipped and counted.
    text_lists: Literal["error", "join"] = "error"
    # Validation text: a separate source, or else the last fraction of every work unit.
    validation_source: str | None = None
    validation_fraction: float = Field(0.05, ge=0.0, lt=1.0)  # 0: no validation split
    # What to do with bytes that are not UTF-8: "replace" them (U+FFFD) or "fail" naming file+offset.
    encoding_errors: Literal["replace", "fail"] = "replace"
    # Read at most this many bytes (per source file): handy to shrink a corpus for a quick run.
    # Decompressed bytes for compressed files, text bytes for CSV/datasets, whole row groups of
    # the text column's size for parquet.
    max_bytes: int | None = Field(None, gt=0)
    # Read at most this many records per source file (lines of .txt, records of JSON lines and
    # CSV/TSV, rows of parquet and datasets): a sample of a corpus by count. Plain text files are
    # then streamed from their start (one unit per file) rather than split by byte range.
    max_rows: int | None = Field(None, gt=0)
    # Lines longer than this many UTF-8 bytes are split (at whitespace, else at this bound) before
    # tokenizing, with a warning saying how many: one huge line must not take a worker's memory.
    # A JSON-lines record is never cut: one longer than this is a bad record (see bad_records).
    max_line_bytes: int = Field(1 << 20, ge=1024)
    # A record that cannot be read (a JSON line cut mid-record, not JSON, not an object, a field that
    # is not text): "fail" the pass naming it, or "skip" it: counted and listed (file, line, reason)
    # in bad_records.jsonl in the shard directory; past max_bad_fraction of the records the pass fails.
    bad_records: Literal["fail", "skip"] = "fail"
    # Under bad_records=skip: the most bad records the pass accepts, as a fraction of the records read.
    max_bad_fraction: float = Field(0.001, ge=0.0, le=1.0)


# The shard splits (prepare/shard_set.SPLITS; importing it here would make an import cycle), the
# pooled evaluation and the one-source corpus's own name: no source may be called so.
RESERVED_SOURCE_NAMES = ("train", "validation", "all", "corpus")


class SourceConfig(_SourceFields):
    """One named source of a mixture (`corpus.sources.<name>`): what `corpus` takes for one source,
    plus its sampling weight. A field left out takes the value `corpus` sets for it (or the default)."""

    source: str  # a path, glob, gs:// or hf: URI, or builtin:python-docs, as corpus.source
    # Share of the training samples drawn from this source (weights are normalised over the sources).
    # 0: evaluation only: all of the source's text is validation text, scored at every evaluation.
    weight: float = Field(1.0, ge=0, le=1e9)


class WeightStage(_Section):
    """From `step` on, sample by these weights (Levanter's staged mixtures) and/or temperature."""

    step: int = Field(ge=0)
    weights: dict[str, float] | None = None  # source -> weight (>= 0); sources left out keep theirs
    temperature: float | None = Field(None, gt=0, le=10)  # as corpus.weight_temperature, from this step on


class CorpusConfig(_SourceFields):
    """Where the text comes from: one source (`source`), or named sources mixed by weight (`sources`)."""

    # Named sources, mixed by weight (replay of general text while continuing on a domain):
    # {name: {source: ..., weight: ..., any field of corpus}}. Unset: the one source `corpus.source`.
    sources: dict[str, SourceConfig] | None = None
    # Weights from each source's size: a source is drawn with probability proportional to
    # weight x (its train samples) ^ temperature (mmBERT's 0.7, 0.5, 0.3); None: by weight alone.
    weight_temperature: float | None = Field(None, gt=0, le=10)
    # Weights that change at given steps: [{step: 1000, weights: {domain: 0.95, general: 0.05}}, ...].
    weight_schedule: list[WeightStage] | None = None

    @model_validator(mode="before")
    @classmethod
    def _sources_inherit(cls, data: Any) -> Any:
        """A source's fields left out take the values `corpus` sets (e.g. one text_field for all)."""
        if not isinstance(data, dict) or not isinstance(data.get("sources"), dict):
            return data
        shared = {k: v for k, v in data.items() if k in _SourceFields.model_fields and k != "source"}
        sources = {}
        for name, entry in data["sources"].items():
            sources[name] = {**shared, **entry} if isinstance(entry, dict) else entry
        return {**data, "sources": sources}

    @model_validator(mode="after")
    def _valid_mixture(self) -> CorpusConfig:
        if self.sources is None:
            if self.weight_schedule or self.weight_temperature is not None:
                raise ValueError("corpus.weight_schedule and corpus.weight_temperature need corpus.sources "
                                 "(named sources to weigh)")
            return self
        if not self.sources:
            raise ValueError("corpus.sources is empty; name at least one source, or use corpus.source")
        if self.source != BUILTIN_CORPUS or self.validation_source:
            raise ValueError("corpus.source / corpus.validation_source and corpus.sources both given; put every "
                             "source under corpus.sources (with its own validation_source)")
        for name, src in self.sources.items():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
                raise ValueError(f"corpus.sources.{name}: a source name is letters, digits, '_', '-', '.' (at most "
                                 f"64, first a letter or digit); rename it")
            if name in RESERVED_SOURCE_NAMES:
                raise ValueError(f"corpus.sources.{name}: the name clashes with a split or a reserved name "
                                 f"({', '.join(RESERVED_SOURCE_NAMES)}); rename it")
            if src.weight == 0 and "validation_fraction" in src.model_fields_set and not src.validation_fraction \
                    and not src.validation_source:
                raise ValueError(f"corpus.sources.{name}: weight 0 (evaluation only) with validation_fraction=0 "
                                 f"has no validation text; drop validation_fraction or give it a weight")
        lowered = {}
        for name in self.sources:
            if name.lower() in lowered:
                raise ValueError(f"corpus.sources: {lowered[name.lower()]!r} and {name!r} differ only in case; "
                                 f"use one name per source")
            lowered[name.lower()] = name
        if not any(w > 0 for w in self.stage_weights(0).values()):
            raise ValueError("corpus.sources: every weight is 0, nothing to train on; give a source a weight > 0")
        previous = -1
        for i, stage in enumerate(self.weight_schedule or []):
            if stage.step <= previous:
                raise ValueError(f"corpus.weight_schedule[{i}].step={stage.step}: steps must increase "
                                 f"(the one before is {previous})")
            previous = stage.step
            unknown = sorted(set(stage.weights or {}) - set(self.sources))
            if unknown:
                raise ValueError(f"corpus.weight_schedule[{i}].weights: {unknown[0]!r} is not a source of "
                                 f"corpus.sources ({', '.join(self.sources)})")
            raised = sorted(k for k, v in (stage.weights or {}).items() if v and self.sources[k].weight == 0)
            if raised:
                raise ValueError(f"corpus.weight_schedule[{i}].weights.{raised[0]}: {raised[0]!r} is evaluation only "
                                 f"(weight 0 in corpus.sources: all its text is validation); give it a weight there")
            bad = {k: v for k, v in (stage.weights or {}).items() if not (v >= 0 and math.isfinite(v))}
            if bad:
                k = next(iter(bad))
                raise ValueError(f"corpus.weight_schedule[{i}].weights.{k}={bad[k]}: a weight is a number >= 0")
            if not any(w > 0 for w in self.stage_weights(stage.step).values()):
                raise ValueError(f"corpus.weight_schedule[{i}]: every weight is 0 from step {stage.step}; give a "
                                 f"source a weight > 0")
        return self

    # --- the mixture, as the stages read it -------------------------------------------------
    def named_sources(self) -> dict[str, _SourceFields]:
        """Every source by name: the mixture's, or the one source as "corpus"."""
        return dict(self.sources) if self.sources is not None else {"corpus": self}

    def stage_weights(self, step: int) -> dict[str, float]:
        """The weights in force at `step` (before temperature): the sources', then each stage's."""
        weights = {name: float(getattr(src, "weight", 1.0)) for name, src in self.named_sources().items()}
        for stage in self.weight_schedule or []:
            if stage.step <= step:
                weights.update(stage.weights or {})
        return weights

    def stage_temperature(self, step: int) -> float | None:
        temperature = self.weight_temperature
        for stage in self.weight_schedule or []:
            if stage.step <= step and stage.temperature is not None:
                temperature = stage.temperature
        return temperature

    def stage_starts(self) -> list[int]:
        """The steps at which the weights change (0 first)."""
        return [0] + [s.step for s in self.weight_schedule or [] if s.step > 0]

    def trained(self) -> list[str]:
        """Sources training draws from; the others (weight 0 in corpus.sources) are evaluation only."""
        return [n for n, src in self.named_sources().items() if getattr(src, "weight", 1.0) > 0]


MAX_EVAL_SAMPLES = 10_000_000


class DownstreamEval(_Section):
    """One task fine-tuned on the model every `every` steps while training goes on (tpu_ray.downstream)."""

    task: str = Field(min_length=1)  # as `tpu-ray finetune --task`: builtin:NAME, glue/NAME, a YAML, files
    every: int = Field(ge=1)  # steps between two fine-tunings of the model (and one at the end)
    seeds: int = Field(1, ge=1, le=100)  # seeds per learning rate, each a Ray task
    # `finetune.KEY` options of those trials without the prefix ({epochs: 1, learning_rates: [3e-4]}).
    finetune: dict[str, Any] = Field(default_factory=dict)


class EvalConfig(_Section):
    """The evaluation set: fixed by the shards alone (not the seed, batch size, replicas or hosts),
    so two runs on the same shards score the same samples under the same masks."""

    # Validation samples scored per source at each evaluation (fewer if the split holds fewer),
    # spread over the whole split.
    samples: int = Field(640, ge=1, le=MAX_EVAL_SAMPLES)
    # Masking rate of the evaluation (token by token, 80/10/10), whatever the training rate, so runs
    # with other recipes compare (ModernBERT and MosaicBERT train at 30% and evaluate at 15%).
    mask_prob: float = Field(0.15, gt=0, lt=1)
    # Downstream tasks fine-tuned on snapshots of the model while it trains (Ray tasks on CPU nodes,
    # beside the training): [{task: builtin:stdlib-packages, every: 1000, seeds: 3}]. Each records
    # `kind: downstream` at its step.
    downstream: list[DownstreamEval] = Field(default_factory=list)


class TokenizerConfig(_Section):
    kind: Literal["unigram", "bpe", "wordpiece"] = "unigram"  # the tokenizer model trained
    vocab_size: int = Field(8000, ge=64, le=1_000_000)  # the vocabulary trained (special tokens included)
    # Use an existing tokenizer directory instead of training one.
    path: str | None = None
    # Train on at most this many bytes of the corpus: all of it when it fits, else units drawn
    # across every file by `seed` (corpus.sample_order), a streamed file giving its first chunk first.
    train_bytes: int = Field(200_000_000, gt=0)
    lowercase: bool = False  # lowercase the text before tokenizing (training and sharding)
    # With model.init_from: learn this many new tokens on the corpus (those that save the most
    # pieces under the checkpoint's tokenizer) and grow the model's embedding and head to them.
    extend_tokens: int | None = Field(None, ge=1, le=1_000_000)
    # With model.init_from: a file of tokens to add to the checkpoint's vocabulary, one a line.
    add_tokens_file: str | None = None


class ShardConfig(_Section):
    seq_len: int = Field(128, ge=8)  # tokens per training sample; must fit the position embeddings
    # Work-unit size, and the text per shard: a byte range of plain text is one train shard (+ one
    # validation shard); a streamed unit (compressed files, packs of them, CSV, tables) writes one
    # per ~unit_bytes of text. Independent of actors.
    unit_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    unit_rows: int = Field(50_000, ge=1)  # work-unit size of tables and datasets, in rows
    num_actors: int | None = Field(None, ge=1, le=4096)  # tokenizer actors (None: the cluster's CPUs)
    # Rust threads per tokenizer actor: actors x threads should not exceed cores.
    tokenizer_threads: int = Field(1, ge=1, le=256)
    # Read/write shards here instead of <output_dir>/shards (e.g. existing or gs:// shards).
    dir: str | None = None
    # A work unit whose actor dies is given to a fresh actor at most this many times, then the run
    # fails naming the unit (a unit that always kills its actor would otherwise be retried forever).
    max_unit_retries: int = Field(3, ge=0)


MODEL_PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
    # The quickstart's: the smallest size measured to learn from context in a few CPU minutes.
    "mini": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


def _published(model_type: str) -> dict[str, Any]:
    """A model type's published config defaults (tpu_ray.families holds them, one entry per type)."""
    fam = FAMILIES[model_type]
    return {**fam.published, "position_offset": fam.position_offset}


# Kept for importers: the two types tpu-ray started with. tpu_ray.families is the registry.
PUBLISHED: dict[str, dict[str, Any]] = {t: _published(t) for t in ("roberta", "bert")}


class ModelConfig(_Section):
    model_type: str = "roberta"  # the transformers architecture: any type in docs/models.md (init_from: the checkpoint's)
    # Start from a checkpoint: a local or gs:// Hugging Face model directory, a name in the local
    # Hugging Face cache, a tpu-ray RUN/model, or a tpu-ray run directory (its last checkpoint).
    init_from: str | None = None
    # The content hash (sha256) of what init_from held when the run copied it into RUN/init/:
    # filled in by the run's first stage, so --resume, every host and every recovery read that
    # copy; set it to refuse a source whose content is not this one.
    init_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    preset: Literal["tiny", "mini", "small", "base", "large"] = "tiny"  # sizes (explicit fields override)
    # Upper bounds: 16x the largest published masked LM (xlm-roberta-xl: hidden 2560, 36 layers,
    # 32 heads, intermediate 10240), so a typo (an extra digit or two) fails here, not as an
    # out-of-memory error after TensorFlow has started.
    hidden_size: int | None = Field(None, gt=0, le=40_960)
    num_hidden_layers: int | None = Field(None, gt=0, le=576)
    num_attention_heads: int | None = Field(None, gt=0, le=512)
    intermediate_size: int | None = Field(None, gt=0, le=163_840)
    # None -> the model type's published value (RoBERTa 514, BERT 512); must fit seq_len + offset.
    max_position_embeddings: int | None = Field(None, gt=0, le=1 << 20)
    # None -> the model type's published value (RoBERTa 1e-5, BERT 1e-12).
    layer_norm_eps: float | None = Field(None, gt=0, lt=1)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)  # hidden and attention dropout (0: none, for short runs)
    # The masked-LM head's output bias at a fresh start: zeros (Hugging Face's), or unigram: the log
    # frequencies of the training shards' tokens, so that step 0 predicts word frequencies
    # (tpu_ray/train/output_bias.py). A run from init_from or train.branch_from keeps the
    # trained bias it starts from (logged), so one config serves the fresh run and its continuations.
    output_bias: Literal["zeros", "unigram"] = "zeros"
    # The standard deviation of a fresh model's weight initialisation (transformers' initializer_range);
    # None -> the model type's published value (0.02 for most). Trained weights (init_from, branch_from)
    # are loaded over it.
    initializer_range: float | None = Field(None, gt=0, le=1)

    @field_validator("model_type")
    @classmethod
    def _known_type(cls, v: str) -> str:
        if v in EXCLUDED:
            raise ValueError(f"not supported: it {EXCLUDED[v]}; use one of {', '.join(sorted(FAMILIES))}")
        if v not in FAMILIES:
            raise ValueError(f"not a TensorFlow masked-LM type tpu-ray trains; use one of {', '.join(sorted(FAMILIES))}")
        return v

    def published(self, key: str) -> Any:
        """A field's value, or the model type's published default when unset."""
        value = getattr(self, key, None)
        return _published(self.model_type).get(key) if value is None else value

    def sizes(self) -> dict[str, int]:
        """Preset sizes with explicit fields taking precedence."""
        out = dict(MODEL_PRESETS[self.preset])
        for key in out:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


class PhaseConfig(_Section):
    """One sequence-length phase (train.phases): `steps` steps at `seq_len` tokens per sample."""

    steps: int = Field(gt=0)
    seq_len: int = Field(ge=8)
    batch_size: int | None = Field(None, gt=0, le=1 << 20)  # None: train.batch_size
    mask_prob: float | None = Field(None, gt=0, lt=1)  # None: train.mask_prob


class TrainConfig(_Section):
    steps: int = Field(1000, gt=0)  # optimizer steps of the whole run
    # At most 2^20 sequences per step (LAMB-scale batches are 64k): beyond, one batch no longer fits.
    batch_size: int = Field(32, gt=0, le=1 << 20, description="global batch size, across all replicas")
    # AdamW's peak rate: published MLM rates are 1e-4..6e-4 (2e-3 for tiny models). No upper bound:
    # a rate that diverges stops at the first non-finite loss, naming the step (train.on_nan).
    learning_rate: float = Field(1e-4, gt=0)
    # None: warmup_ratio x steps. More than steps is allowed (a shrunk config's smoke test): the
    # rate then rises for the whole run and never reaches learning_rate.
    warmup_steps: int | None = Field(None, ge=0)
    warmup_ratio: float = Field(0.05, ge=0, le=1)  # warm-up as a fraction of steps (when warmup_steps is None)
    # The rate after warm-up (train/curves.py, docs/schedules.md): "linear" decay to min_lr_ratio x the peak
    # at train.steps (BERT's), "cosine", "constant" (the peak to the end: a stable run to branch decays
    # from), "wsd" (warm-up, the peak, then a decay over the last decay_steps: ModernBERT's trapezoid).
    schedule: Literal["linear", "cosine", "constant", "wsd"] = "linear"
    decay_steps: int | None = Field(None, gt=0)  # wsd: the decay's steps, at most train.steps (None: decay_fraction)
    decay_fraction: float = Field(0.2, gt=0, le=1)  # wsd: the decay's share of train.steps (when decay_steps is None)
    decay_shape: Literal["linear", "1-sqrt"] = "1-sqrt"  # wsd: the decay's shape (1-sqrt: ModernBERT's)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)  # where linear/cosine/wsd end, as a share of learning_rate
    # Start from this run's last committed checkpoint (a run directory) or one of its checkpoints
    # (RUN/checkpoints/ckpt-N): weights, optimizer state, step and data position, under this run's
    # schedule (a decay branched off a stable run, which is not touched). Same shards, model and data order,
    # and train.phases the same up to the checkpoint's step (the phase holding it may end elsewhere);
    # its learning and masking rates at that step the stable run's (train/branch.py: no jump).
    branch_from: str | None = None
    # The masking rate over the run: "constant" (train.mask_prob), or "linear" from train.mask_prob at
    # step 0 to train.mask_prob_end at train.steps (a tensor in the input pipeline: no recompile).
    mask_schedule: Literal["constant", "linear"] = "constant"
    mask_prob_end: float | None = Field(None, gt=0, lt=1)  # the masking rate at train.steps (mask_schedule=linear)
    # Sequence-length phases, in order: [{steps: 900, seq_len: 128}, {steps: 100, seq_len: 512}]
    # (each may set batch_size and mask_prob). train.steps is their sum and shard.seq_len the longest
    # (both filled in when left out); one compile per phase (docs/schedules.md). None: one phase.
    phases: list[PhaseConfig] | None = Field(None, min_length=1, max_length=16)
    # Decoupled weight decay (0 = none, 0.01 published): a rate over 1 flips the weights' sign.
    weight_decay: float = Field(0.01, ge=0, le=1)
    # Fraction of tokens masked: 0.15 is BERT's; up to 0.4 is published (Wettig et al. 2023: 40% beats
    # 15% for BERT-large; MosaicBERT trains at 30%).
    mask_prob: float = Field(0.15, gt=0, lt=1)
    # Mask whole words (all pieces of a word together; word starts from the tokenizer: ▁/Ġ prefixes,
    # WordPiece ## continuations): google-research/bert's whole-word masking.
    whole_word_mask: bool = False
    # How many tokens a sequence masks: "random", each token independently with mask_prob (Hugging
    # Face's collator; the count varies, so the MLM head scores up to mean + 6 sd positions per
    # sequence); "exact", round(mask_prob x its maskable tokens) (google-research/bert's
    # create_pretraining_data: the head scores only that many, less work per step). Whole-word
    # masking always draws per word.
    mask_count: Literal["random", "exact"] = "random"
    # Of the selected tokens: this fraction becomes the mask token, `random_token_fraction` a random
    # token, the rest stays unchanged (BERT's 80/10/10).
    mask_token_fraction: float = Field(0.8, ge=0, le=1)
    random_token_fraction: float = Field(0.1, ge=0, le=1)  # of the selected tokens, replaced by a random token
    log_every: int = Field(10, gt=0)  # steps between train records (and at the last step)
    eval_every: int = Field(500, gt=0)  # steps between evaluations (and at the last step)
    checkpoint_every: int = Field(500, gt=0)  # steps between checkpoints (and at the last step)
    keep_checkpoints: int = Field(3, gt=0)  # the newest K checkpoints are kept
    # Also checkpoint when this many minutes passed since the last one: bounds the work a lost node
    # costs in wall time, whatever the step time (None: by steps only).
    checkpoint_every_minutes: float | None = Field(None, gt=0)
    # Steps per host round trip (None: 64 on TPU, 1 elsewhere); never crosses a log/eval/checkpoint step.
    steps_per_execution: int | None = Field(None, gt=0)
    # Samples held for shuffling (memory: buffer x seq_len x 16 bytes per input pipeline).
    shuffle_buffer: int = Field(10_000, gt=0, le=10_000_000)
    strategy: Literal["auto", "tpu", "gpu", "multiworker", "cpu"] = "auto"  # tf.distribute strategy (auto: the hardware's)
    tpu_name: str | None = None  # reserve only the TPU slice of this name (TensorFlow dials the reserved one)
    # auto: bfloat16 on TPU, float16 with loss scaling on GPU, float32 on CPU.
    mixed_precision: Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"] = "auto"
    jit_compile: bool | None = None  # XLA-compile the train step (None: the strategy's default)
    # Peak FLOP/s of one device for MFU when the device is not in the table (e.g. a CPU).
    peak_flops: float | None = Field(None, gt=0)
    # Split the CPU into this many logical devices (MirroredStrategy): a v3-8 stand-in for tests.
    cpu_replicas: int = Field(1, ge=1, le=64)
    # Where the training process runs on Ray: in this process ("local"), on a TPU slice's head
    # host ("tpu": takes the TPU-<topology>-head resource), or on a GPU node ("gpu").
    placement: Literal["auto", "local", "tpu", "gpu"] = "auto"
    tpu_topology: str | None = Field(None, pattern=r"^v[0-9][a-z]*-[0-9]+$")  # the pod type to reserve, e.g. v4-16
    tpu_wait_timeout_s: float = Field(1800.0, gt=0, le=30 * 86400, description="how long training waits for a free TPU slice "
                                      "(e.g. while the autoscaler launches it) before failing; at most 30 days")
    num_gpus: int | None = Field(None, ge=1, le=1024)  # GPUs of the training node (None: all it has)
    # MultiWorkerMirroredStrategy across this many Ray workers (CPU/GPU clusters).
    workers: int = Field(1, ge=1, le=4096)
    # workers > 1 opens TensorFlow's gRPC servers (one port per worker) on EVERY interface of each
    # worker's node, without authentication: TensorFlow binds 0.0.0.0 whatever TF_CONFIG names.
    # Set true only where a firewall lets nothing but the cluster's own nodes reach them
    # (docs/cluster.md, "What is exposed, to whom"); never on a workstation on a shared network.
    workers_network_closed: bool = False
    # A NaN/inf loss or weights: "stop" with an error naming the step (the last good checkpoint is
    # kept), or "continue" with a warning (checkpoints with non-finite weights are still not saved).
    on_nan: Literal["stop", "continue"] = "stop"
    # On --resume, accept train.steps / warmup / learning_rate that differ from the checkpoint's:
    # the run continues under the new schedule from the checkpoint's step (e.g. to extend a run).
    extend_schedule: bool = False
    # On --resume, accept a different data order than the checkpoint's (another number of input
    # pipelines, i.e. hosts, or another train.shuffle_buffer): the run continues at the same step
    # under the new order, which repeats or skips some samples of the current epoch.
    accept_new_data_order: bool = False
    # TPU/GPU placement and multi-worker runs: when a training node (or slice) is lost, wait for capacity and
    # resume from the last committed checkpoint, at most this many times (0: the run fails).
    max_failures: int = Field(3, ge=0)
    # How long a resume waits for a replacement slice or GPU node before the run fails.
    resume_wait_minutes: float = Field(60.0, gt=0, le=30 * 1440)  # at most 30 days, as tpu_wait_timeout_s

    @model_validator(mode="before")
    @classmethod
    def _drop_removed(cls, data: Any) -> Any:
        """train.eval_pad_multiple never did anything and was removed; saved configs and
        YAML files that still name it load as before."""
        if isinstance(data, dict) and "eval_pad_multiple" in data:
            data = {k: v for k, v in data.items() if k != "eval_pad_multiple"}
        return data

    def fingerprint(self) -> dict[str, Any]:
        """The train fields that shape the data and the model (RunConfig.fingerprint's `train`): apart
        so a comparison of two train sections (a branch and its stable run) reads the same fields."""
        keep = self.model_dump(mode="json", include={"batch_size", "weight_decay", "whole_word_mask",
                                                     "mask_token_fraction", "random_token_fraction", "mask_count",
                                                     *SCHEDULE_FIELDS})
        if self.phases is not None:  # only then: a run without phases keeps its fingerprint's bytes
            keep["phases"] = [p.model_dump(mode="json") for p in self.phases]
        return keep


class RayConfig(_Section):
    # The Ray cluster. None: RAY_ADDRESS, else a head running on this machine, else a new one; "local": always a
    # new one of the run's own (on a shared machine); HOST:PORT or ray://HOST:PORT: that one. The run says which.
    address: str | None = None
    num_cpus: int | None = Field(None, gt=0, le=4096)  # CPUs of a local cluster started here
    # Local paths (output_dir, shard.dir) are one mount every node shares (NFS, Filestore): allows
    # them on a multi-node cluster, where they are otherwise refused for sharding and TPU/GPU runs.
    shared_filesystem: bool = False


class MlflowTracking(_Section):
    """An MLflow tracking server the run's records also go to (tpu_ray/tracking)."""

    uri: str | None = None  # e.g. http://127.0.0.1:5000, databricks, file:///home/me/mlruns (None: off)
    experiment: str = "tpu-ray"  # made if missing
    run_name: str | None = None  # None: the run's name
    tags: dict[str, str] = Field(default_factory=dict)  # the tracked run's tags, e.g. {team: nlp}


class WandbTracking(_Section):
    """A Weights & Biases project the run's records also go to (tpu_ray/tracking)."""

    project: str | None = None  # None: off
    entity: str | None = None  # team or user (None: W&B's default for the login)
    run_name: str | None = None  # None: the run's name
    tags: list[str] = Field(default_factory=list)  # the tracked run's tags, e.g. [baseline]
    # online, offline (files under RUN/wandb, `wandb sync` later); None: W&B's own (WANDB_MODE)
    mode: Literal["online", "offline"] | None = None


class TrackingConfig(_Section):
    """Experiment trackers: config as parameters, records as metrics at their step, model card,
    report and plots as artifacts; a resumed run continues its tracked run (RUN/tracking.json)."""

    mlflow: MlflowTracking = Field(default_factory=MlflowTracking)
    wandb: WandbTracking = Field(default_factory=WandbTracking)


@dataclass(frozen=True)
class RunPaths:
    """Where a run's files live (run directory, tokenizer, shard sets): what most stages need of the
    run besides their own section, handed to them in place of the whole config."""

    run_dir: str
    tokenizer_dir: str
    shards_dir: str  # the main shard set, cut at `seq_len` (shard.seq_len)
    seq_len: int

    def shards_at(self, seq_len: int) -> str:
        """Where the shards a phase at `seq_len` trains on are: another length's set in a folder of its own."""
        from tpu_ray import storage

        return self.shards_dir if seq_len == self.seq_len else storage.join(self.shards_dir, f"seq-{seq_len}")


@dataclass(frozen=True)
class InitSpec:
    """What resolving `model.init_from` reads of a run, built once by whoever assembles the run:
    the model section (the source, its pinned hash, the type and sizes a config may name), the
    tokenizer section (tokenizer.path, the tokens an extension adds), the run's locations (RUN/init,
    its tokenizer directory; shard.seq_len against the checkpoint's positions) and
    train.branch_from (a branch reads its stable run's copy of the same source)."""

    model: ModelConfig
    tokenizer: TokenizerConfig
    paths: RunPaths
    branch_from: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    """What the model's transformers config is made from: the model section; the position
    embeddings the run gives a fresh model (RunConfig.max_positions) and the run's shard length
    (Longformer's attention window); where the run's tokenizer is (its extension record; named when
    refused); with model.init_from, the checkpoint's resolution (init_from.InitSpec)."""

    model: ModelConfig
    max_positions: int
    seq_len: int
    tokenizer_dir: str
    init: InitSpec | None = None

@dataclass(frozen=True)
class BranchSpec:
    """What a branch reads of its run, built by the caller that assembles the run: the sections that
    must be the stable run's (the model, how the shards are cut, the seed, the train fields that decide
    the batches and masks, the mixture's weights), the train section whose schedule is the branch's
    own, and the shards and tokenizer it names (shard.dir, tokenizer.path; None: the stable run's), with
    the vocabulary extension it names (tokenizer.extend_tokens, add_tokens_file: the stable run's or none)."""

    train: TrainConfig
    model: ModelConfig
    shard: ShardConfig
    corpus: CorpusConfig
    seed: int
    tokenizer_path: str | None
    extension: tuple[int | None, str | None] = (None, None)


class RunConfig(_Section):
    name: str = "run"  # the run's name (default directory runs/<name>)
    seed: int = Field(0, ge=0, lt=2**32)  # numpy's and TF's seed range
    output_dir: str | None = None  # the run directory, local or gs:// (None: runs/<name>)
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    shard: ShardConfig = Field(default_factory=ShardConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @model_validator(mode="before")
    @classmethod
    def _phases_fill(cls, data: Any) -> Any:
        """train.phases decide train.steps (their sum) and shard.seq_len (the longest) when those are
        left out; given, they must agree (checked after validation, in one line)."""
        train = data.get("train") if isinstance(data, dict) else None
        phases = train.get("phases") if isinstance(train, dict) else None
        if not isinstance(phases, list) or not phases or not all(isinstance(p, dict) for p in phases):
            return data
        try:
            steps = sum(int(p["steps"]) for p in phases)
            longest = max(int(p["seq_len"]) for p in phases)
        except (KeyError, TypeError, ValueError):
            return data  # the phase's own validation names what is wrong
        if any(not isinstance(p[k], int) or p[k] < low for p in phases for k, low in (("steps", 1), ("seq_len", 8))):
            return data  # likewise: train.phases[i].steps is named, not the sum
        data = dict(data)
        if "steps" not in train:
            data["train"] = {**train, "steps": steps}
        shard = data.get("shard")
        if shard is None or isinstance(shard, dict) and "seq_len" not in shard:
            data["shard"] = {**(shard or {}), "seq_len": longest}
        return data

    @model_validator(mode="before")
    @classmethod
    def _eval_batches_moved(cls, data: Any) -> Any:
        """train.eval_batches (batches of the training batch size) became eval.samples (the
        evaluation set must not depend on the batch size); configs that still name it load as
        eval_batches x batch_size samples."""
        train = data.get("train") if isinstance(data, dict) else None
        if not isinstance(train, dict) or "eval_batches" not in train:
            return data
        train = dict(train)
        batches = train.pop("eval_batches")
        section = dict(data.get("eval") or {})
        if isinstance(batches, int) and not isinstance(batches, bool) and batches > 0 and "samples" not in section:
            batch_size = train.get("batch_size", TrainConfig.model_fields["batch_size"].default)
            if isinstance(batch_size, int) and batch_size > 0:
                section["samples"] = min(batches * batch_size, MAX_EVAL_SAMPLES)
        return {**data, "train": train, "eval": section}

    @field_validator("name")
    @classmethod
    def _name_is_a_path_part(cls, v: str) -> str:
        if not v or "/" in v or "\\" in v or v in (".", ".."):
            raise ValueError("must be a non-empty name without '/', and not '.' or '..'")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        t = self.train
        if t.mask_token_fraction + t.random_token_fraction > 1:
            raise ValueError(f"train.mask_token_fraction={t.mask_token_fraction} + train.random_token_fraction="
                             f"{t.random_token_fraction} exceed 1; they are shares of the selected tokens")
        if t.mixed_precision != "auto":  # auto: checked by the trainer once the hardware is known
            if why := mixed_precision_refusal(self.model.model_type, t.mixed_precision):
                raise ValueError(why)
        if t.workers > 1 and not t.workers_network_closed:
            raise ValueError(f"train.workers={t.workers}: multi-worker training opens TensorFlow's gRPC ports on every "
                             f"interface of each worker's node with no authentication (TensorFlow cannot bind one "
                             f"address); close them with a firewall that admits only the cluster's nodes "
                             f"(docs/cluster.md, 'What is exposed, to whom'), then set "
                             f"train.workers_network_closed=true, or train with train.workers=1")
        if self.model.initializer_range is not None and self.model.model_type in ("xlm", "flaubert"):
            raise ValueError(f"model.initializer_range: {self.model.model_type} has no initializer_range "
                             f"(it initialises with init_std and embed_init_std); leave it unset")
        if why := _phases_refusal(self):
            raise ValueError(why)
        if why := _schedule_refusal(self):
            raise ValueError(why)
        positions = self.max_positions()
        # With init_from the checkpoint's positions decide (checked when it is read: train/init_from.py).
        if self.positions_needed() > positions and not self.model.init_from:
            raise ValueError(
                f"shard.seq_len={self.shard.seq_len} needs model.max_position_embeddings >= "
                f"{self.positions_needed()} ({self.model.model_type} positions start at "
                f"{self.model.published('position_offset')}), got {positions}"
            )
        sizes = self.model.sizes()
        if sizes["hidden_size"] % sizes["num_attention_heads"]:
            raise ValueError(
                f"model.hidden_size={sizes['hidden_size']} is not a multiple of "
                f"model.num_attention_heads={sizes['num_attention_heads']}"
            )
        return self

    # --- derived values -------------------------------------------------------------------
    def max_positions(self) -> int:
        return int(self.model.published("max_position_embeddings"))

    def positions_needed(self) -> int:
        """Position embeddings a seq_len sample uses: seq_len + 2 for RoBERTa, seq_len for BERT."""
        return self.shard.seq_len + int(self.model.published("position_offset"))

    def max_input_tokens(self) -> int:
        """The longest input the exported model takes (the tokenizer's model_max_length): 512."""
        return self.max_positions() - int(self.model.published("position_offset"))

    @property
    def run_dir(self) -> str:
        return self.output_dir or str(Path("runs") / self.name)

    @property
    def shards_dir(self) -> str:
        from tpu_ray import rundir

        return self.shard.dir or rundir.path(self.run_dir, rundir.SHARDS_DIR)

    @property
    def tokenizer_dir(self) -> str:
        from tpu_ray import rundir

        return self.tokenizer.path or rundir.path(self.run_dir, rundir.TOKENIZER_DIR)

    @property
    def paths(self) -> RunPaths:
        """Where this run's files are, for the stages that only read or write them."""
        return RunPaths(self.run_dir, self.tokenizer_dir, self.shards_dir, self.shard.seq_len)

    @property
    def init_spec(self) -> InitSpec:
        """What resolving model.init_from reads of this run (train/init_from.py)."""
        return InitSpec(self.model, self.tokenizer, self.paths, self.train.branch_from)

    @property
    def branch_spec(self) -> BranchSpec:
        """What a branch (train.branch_from) reads of this run (train/branch.py)."""
        return BranchSpec(self.train, self.model, self.shard, self.corpus, self.seed, self.tokenizer.path,
                          (self.tokenizer.extend_tokens, self.tokenizer.add_tokens_file))

    @property
    def model_spec(self) -> ModelSpec:
        """What this run's model is built from (train/model.py hf_config)."""
        return ModelSpec(self.model, self.max_positions(), self.shard.seq_len, self.tokenizer_dir, self.init_spec)

    # --- loading and overriding -------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], origin: str = "config") -> RunConfig:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise UserError(f"{origin}: {_one_line(exc, data)}") from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> RunConfig:
        from tpu_ray import storage

        path = str(path)
        try:
            text = storage.read_text(path)
        except FileNotFoundError:
            raise UserError(f"{path}: config file not found; pass an existing YAML file") from None
        except IsADirectoryError:
            raise UserError(f"{path}: is a directory, not a config file; pass a YAML file") from None
        except UnicodeDecodeError as exc:
            raise UserError(f"{path}: byte {exc.start} is not UTF-8 text, this is not a YAML config; "
                            f"pass a YAML file") from None
        try:
            # safe_load: a config is data, never code (no python/object tags).
            data = yaml.load(text, Loader=_UniqueKeyLoader)
        except _DuplicateKey as exc:
            raise UserError(f"{path}: {exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise UserError(f"{path}:{where}: malformed YAML ({problem}); fix the syntax") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise UserError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
        return cls.from_dict(data, origin=path)

    def override(self, overrides: dict[str, Any] | list[str]) -> RunConfig:
        """Return a copy with dotted keys replaced: {"train.steps": 50} or ["train.steps=50"]."""
        if isinstance(overrides, list):
            overrides = parse_overrides(overrides)
        if "train.eval_batches" in overrides:  # moved: batches of the batch size -> eval.samples
            overrides = dict(overrides)
            batches = overrides.pop("train.eval_batches")
            batch_size = overrides.get("train.batch_size", self.train.batch_size)
            overrides.setdefault("eval.samples", batches * batch_size if isinstance(batches, int)
                                 and isinstance(batch_size, int) else batches)
        data = self.model_dump()
        for dotted, value in overrides.items():
            _set_dotted(data, dotted, value)
        if overrides.get("train.phases"):  # new phases decide the steps and the length unless those are given too
            for dotted in ("train.steps", "shard.seq_len"):
                if dotted not in overrides:
                    section, key = dotted.split(".")
                    data[section].pop(key, None)
        return type(self).from_dict(data, origin="override")

    def to_yaml(self) -> str:
        """The config as YAML; beside corpus.sources no corpus.source (its unused default, which read
        as a second corpus in a saved config)."""
        data = self.model_dump(mode="json")
        if data["corpus"].get("sources"):
            data["corpus"].pop("source", None)
        return yaml.safe_dump(data, sort_keys=False)

    def fingerprint(self) -> dict[str, Any]:
        """What must match when a run directory is resumed: everything that shapes the data/model.
        The SCHEDULE_FIELDS among it may change under train.extend_schedule (saved_config.py)."""
        keep = self.model_dump(mode="json", include={"corpus", "tokenizer", "shard", "model", "seed", "eval"})
        # The mixture's weights decide the data order, not the data: a change of them is checked on
        # resume with the input position (train.accept_new_data_order), like the shuffle buffer.
        for key in ("weight_temperature", "weight_schedule"):
            keep["corpus"].pop(key, None)
        for src in (keep["corpus"].get("sources") or {}).values():
            src["evaluation_only"] = src.pop("weight") == 0  # all its text is validation: other shards
        keep["train"] = self.train.fingerprint()
        return keep


# The train fields that shape the learning-rate and masking curves: pinned on --resume (fingerprint)
# unless train.extend_schedule says the run continues under a new schedule.
SCHEDULE_FIELDS = ("learning_rate", "warmup_steps", "warmup_ratio", "schedule", "decay_steps", "decay_fraction", "decay_shape",
                   "min_lr_ratio", "mask_prob", "mask_schedule", "mask_prob_end")


def _phases_refusal(cfg: RunConfig) -> str | None:
    """One line for train.phases that cannot run, else None."""
    t = cfg.train
    if not t.phases:
        return None
    total, longest = sum(p.steps for p in t.phases), max(p.seq_len for p in t.phases)
    if t.steps != total:
        return (f"train.steps={t.steps} conflicts with train.phases, whose steps sum to {total}; set "
                f"train.steps={total} or leave it out (the phases decide it)")
    if cfg.shard.seq_len != longest:
        return (f"shard.seq_len={cfg.shard.seq_len} must be the longest phase's seq_len ({longest}) with train.phases "
                f"(the model's positions and the evaluation are at that length); set shard.seq_len={longest} or "
                f"leave it out")
    offset, positions = int(cfg.model.published("position_offset")), cfg.max_positions()
    for i, p in enumerate(t.phases):
        if p.seq_len + offset > positions and not cfg.model.init_from:
            return (f"train.phases[{i}].seq_len={p.seq_len} needs model.max_position_embeddings >= {p.seq_len + offset}, "
                    f"got {positions}; shorten the phase or raise model.max_position_embeddings")
        if p.mask_prob is not None and t.mask_schedule == "linear":
            return (f"train.phases[{i}].mask_prob={p.mask_prob} and train.mask_schedule=linear both set the masking "
                    f"rate; keep one")
    return None


def _schedule_refusal(cfg: RunConfig) -> str | None:
    """One line for schedule options that contradict each other, else None."""
    t = cfg.train
    if t.schedule == "wsd" and t.decay_steps is not None and t.decay_steps > t.steps:
        return (f"train.decay_steps={t.decay_steps} is longer than the run (train.steps={t.steps}); use at most "
                f"{t.steps}, or train.decay_fraction")
    if t.mask_schedule == "linear" and t.mask_prob_end is None:
        return ("train.mask_schedule=linear needs train.mask_prob_end (the masking rate at train.steps); set it, "
                "e.g. train.mask_prob_end=0.15")
    if t.mask_schedule == "constant" and t.mask_prob_end is not None:
        return (f"train.mask_prob_end={t.mask_prob_end} does nothing with train.mask_schedule=constant; set "
                f"train.mask_schedule=linear or remove it")
    tk = cfg.tokenizer
    for name in ("extend_tokens", "add_tokens_file"):
        value = getattr(tk, name)
        if value is not None and not cfg.model.init_from:
            return (f"tokenizer.{name}={value} extends a checkpoint's vocabulary: set model.init_from (a "
                    f"tokenizer trained from scratch learns the corpus's tokens itself: tokenizer.vocab_size)")
        if value is not None and tk.path:
            return (f"tokenizer.{name}={value} and tokenizer.path={tk.path} both say what the tokenizer is; "
                    f"keep one (tokenizer.path: an extended tokenizer made earlier)")
    return None


class _DuplicateKey(Exception):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping: YAML keeps the last silently, so a
    source named twice in corpus.sources (or a field set twice) would quietly lose one."""

    def construct_mapping(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        seen: dict[Any, int] = {}
        own = [k for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"]  # a merged key may be overridden
        self.flatten_mapping(node)  # YAML merge keys (`<<: *base`), as safe_load reads them
        for key_node in own:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise _DuplicateKey(f"line {line}: key {key!r} is given twice in one mapping (first on line "
                                    f"{seen[key]}); keep one")
            if isinstance(key, (str, int, float, bool)):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Parse `a.b=value` strings; values are YAML scalars (safe_load), so 50 is an int."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"override {item!r}: expected section.key=value, e.g. train.steps=50")
        key, raw = item.split("=", 1)
        if not raw.strip():  # `output_dir=$OUT` with OUT unset: never silently "the default"
            raise UserError(f"override {item!r}: empty value; give one, or write {key.strip()}=null for "
                            f"the default")
        try:
            out[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            options = list(node) if isinstance(node, dict) else []
            hint = difflib.get_close_matches(part, options, n=1)
            where = ".".join(parts[:i]) or "top level"
            suggestion = f"; did you mean '{'.'.join(parts[:i] + hint)}'?" if hint else ""
            raise UserError(f"override {dotted!r}: no key {part!r} in {where}{suggestion}")
        if i == len(parts) - 1:
            node[part] = value
        else:
            node = node[part]


def _one_line(exc: ValidationError, data: dict[str, Any]) -> str:
    """Turn pydantic's report into one line: field, problem, and a 'did you mean' for typos."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "config"
    if err["type"] == "extra_forbidden":
        section = _section_model(err["loc"][:-1])
        options = list(section.model_fields) if section else []
        hint = difflib.get_close_matches(str(err["loc"][-1]), options, n=1)
        prefix = ".".join(str(p) for p in err["loc"][:-1])
        fix = f"did you mean '{prefix + '.' if prefix else ''}{hint[0]}'?" if hint else "remove it"
        more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        return f"unknown key '{loc}'; {fix}{more}"
    value = err.get("input")
    shown = json.dumps(value) if isinstance(value, (int, float, str, bool, type(None))) else type(value).__name__
    msg = err["msg"].replace("Value error, ", "")
    more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    if err["type"] == "value_error" and (not err["loc"] or isinstance(value, (dict, list))):
        return f"{msg}{more}"  # a section's own check names its fields itself
    return f"{loc}={shown}: {msg}{more}"


def _section_model(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = RunConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return None
        model = field.annotation
    return model


def load_run_config(config_file: str | None, output_dir: str | None = None, corpus: str | None = None,
                    overrides: list[str] | None = None) -> RunConfig:
    """The run config every entry point builds: a YAML file (or the defaults), then --output-dir,
    --corpus and dotted `section.key=value` overrides, in that order."""
    cfg = RunConfig.from_yaml(config_file) if config_file else RunConfig()
    values = parse_overrides(overrides or [])
    if output_dir:
        values["output_dir"] = output_dir
    if corpus:
        values["corpus.source"] = corpus
    return cfg.override(values) if values else cfg
