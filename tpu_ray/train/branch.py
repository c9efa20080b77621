"""Decays branched off a stable run (`train.branch_from`).

A long run at a constant rate (train.schedule=constant, or wsd before its decay) is continued in a
new run directory from one of its checkpoints, under the new run's schedule (typically wsd with the
decay starting at the branch step): a finished model for that budget, without restarting, while the
stable run goes on. The branch takes the checkpoint's weights, optimizer state (moments and the
iteration counter the schedule reads) and step; its data position follows from the step, as on
--resume, so the branch sees exactly the batches and masks the stable run would have seen next.
That holds only for the same shards, tokenizer, model, seed, batch and shuffle buffer: checked here
against the stable run's config.yaml before anything is restored. The stable run is only read.
Those checks compare sections (`BranchSpec`: what a branch reads of its run), never two whole configs.
With train.phases the branch continues in the phase its step falls in: the phases must agree with
the stable run's over the steps it trained (phases.trained_difference); the phase holding the
branch step may end elsewhere (a shorter or longer last phase is the branch's budget).

A branch never jumps: at the branch step its learning rate and masking rate are the
stable run's (within RTOL), or it is refused in one line naming the setting that makes them so.
Two defaults make the common branch continuous by itself: an unset train.warmup_steps is the stable
run's warm-up, and a wsd decay without train.decay_steps starts at the branch step (decay_fraction
scales train.steps, which for a branch is the stable run's step plus the decay). Both are filled
into the branch's config (`settled`, where the whole config is assembled), so config.yaml records them
and a resumed branch keeps them.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any

from tpu_ray import rundir, storage
from tpu_ray.config import SCHEDULE_FIELDS, BranchSpec, RunConfig, TrainConfig
from tpu_ray.errors import UserError
from tpu_ray.train import curves
from tpu_ray.train.phases import phase_spans, span_at, spans, trained_difference

log = logging.getLogger("tpu_ray.train.loop")
_CKPT = re.compile(r"^ckpt-(\d+)$")
# Train fields that decide which batch and which masks a step sees, beside the fingerprint's.
_DATA_ORDER = ("shuffle_buffer",)
RTOL = 1e-6  # how close the branch's rates at the branch step must be to the stable run's


@dataclass(frozen=True)
class Branch:
    run_dir: str  # the stable run
    checkpoint: str  # its checkpoint prefix (.../checkpoints/ckpt-N)
    step: int
    train: TrainConfig  # the branch's train section with its defaults filled in (`with_defaults`)
    # The dotted overrides that make this run's config the branch's (`settled`): its defaults, and the
    # stable run's shards and tokenizer where it names none (`stable_data`).
    overrides: dict[str, Any]


def stable_run_dir(branch_from: str) -> str:
    """The stable run's directory: `branch_from` itself, or the run holding the checkpoint it names."""
    where = str(branch_from).rstrip("/")
    if _CKPT.match(where.rsplit("/", 1)[-1]):
        return where.rsplit("/", 1)[0].rsplit("/", 1)[0]
    return where


def locate(branch_from: str) -> tuple[str, str, int]:
    """(the stable run's directory, the checkpoint, its step) that `train.branch_from` names: one of
    its checkpoints, or a run (its last committed one)."""
    where = str(branch_from).rstrip("/")
    found = _CKPT.match(where.rsplit("/", 1)[-1])
    if found:
        run_dir = stable_run_dir(where)
        checkpoint, step = where, int(found.group(1))
        if not storage.exists(checkpoint + ".index"):
            raise UserError(f"train.branch_from={where}: no such checkpoint ({checkpoint}.index is missing: the "
                            f"stable run keeps its last train.keep_checkpoints); name one it keeps, or the run "
                            f"itself for its latest (a branch that named the run is pinned to the checkpoint it "
                            f"found: start it again, before it has trained, to take the latest)")
        return run_dir, checkpoint, step
    from tpu_ray.resume import latest_checkpoint

    latest = latest_checkpoint(where)
    if latest is None or latest[1] is None:
        raise UserError(f"train.branch_from={where}: no committed checkpoint there; point at a tpu-ray run "
                        f"directory that has trained, or at one of its checkpoints (RUN/checkpoints/ckpt-N)")
    return where, latest[0], latest[1]


def resolve(spec: BranchSpec) -> Branch:
    """The checkpoint `train.branch_from` names (a run: its last committed one), checked against what
    this run reads (`spec`): one line naming what differs, or how to point at the stable run's data."""
    where = str(spec.train.branch_from).rstrip("/")
    run_dir, checkpoint, step = locate(where)
    data = stable_data(spec.shard.dir, spec.tokenizer_path, run_dir, spec.extension)
    stable = _check_compatible(spec, data, run_dir, where, step)
    if step >= spec.train.steps:
        raise UserError(f"train.branch_from={where}: its checkpoint is at step {step}, not before train.steps="
                        f"{spec.train.steps}; set train.steps beyond {step} (the branch's decay ends there)")
    filled = _defaults(spec.train, stable.train, step)
    settled_train = _with(spec.train, filled)
    if why := continuity_refusal(stable.train, settled_train, step):
        raise UserError(f"train.branch_from={where}: {why}")
    # A run named by its directory is pinned to the checkpoint checked here: the stable run goes on
    # training, and a later start (the trainer's, after a wait for a slice) must branch from this one,
    # whose step the filled defaults were made for, not from whatever is latest by then.
    pin = {"train.branch_from": _absolute(checkpoint)} if checkpoint.rstrip("/") != where else {}
    return Branch(run_dir, checkpoint, step, settled_train,
                  {**data, **{f"train.{k}": v for k, v in filled.items()}, **pin})


def settled(cfg: RunConfig) -> RunConfig:
    """`cfg` with the branch's defaults filled in, checked: a fresh branch resolves its checkpoint
    (all refusals here, before any stage starts); a resumed one (its own checkpoints) takes what its
    first start filled in from its config.yaml (the stable run's latest checkpoint may have moved).
    It takes the whole config because it makes one: the branch's, which every stage of the run
    (pipeline, trainer) then reads and config.yaml records; everything else here takes sections."""
    if not cfg.train.branch_from:
        return cfg
    from tpu_ray.resume import latest_checkpoint
    from tpu_ray.saved_config import read_saved_config

    saved, trained = read_saved_config(cfg.run_dir), latest_checkpoint(cfg.run_dir) is not None
    cfg = _kept(cfg, saved.train.branch_from if saved is not None else None, trained)
    if not trained:
        spec = cfg.branch_spec
        over = resolve(spec).overrides
        return cfg.override(over) if over else cfg
    if saved is None or not _same_branch_point(saved.train.branch_from, cfg.train.branch_from):
        return cfg
    t, s = cfg.train, saved.train
    over = {f"train.{k}": getattr(s, k) for k in ("warmup_steps", "decay_steps")
            if getattr(t, k) is None and getattr(s, k) is not None and (k != "decay_steps" or t.schedule == "wsd")}
    over.update({k: v for k, v, given in (("shard.dir", saved.shard.dir, cfg.shard.dir),
                                          ("tokenizer.path", saved.tokenizer.path, cfg.tokenizer.path)) if v and not given})
    if "tokenizer.path" in over:  # the tokenizer its first start read: an extension named must be that one's
        over.update(inherited_vocabulary(over["tokenizer.path"], (cfg.tokenizer.extend_tokens,
                                         cfg.tokenizer.add_tokens_file), stable_run_dir(s.branch_from)))
    return cfg.override(over) if over else cfg


def kept_branch_point(cfg: RunConfig) -> RunConfig:
    """`cfg` with the branch point its run's first start pinned (its config.yaml's train.branch_from)
    where this start names the same stable run again: always once the branch has trained; before,
    while that checkpoint is still there (else the stable run's latest is resolved anew). A branch
    that has trained and now names another branch point is refused while the saved one's run is
    there: its weights came from the saved one, which its config.yaml, model card and `compare` must
    keep naming. Doctor asks it too."""
    from tpu_ray.resume import latest_checkpoint
    from tpu_ray.saved_config import read_saved_config

    if not cfg.train.branch_from:
        return cfg
    found = read_saved_config(cfg.run_dir)
    return _kept(cfg, found.train.branch_from if found is not None else None,
                 latest_checkpoint(cfg.run_dir) is not None)


def _kept(cfg: RunConfig, saved: str | None, trained: bool) -> RunConfig:
    """kept_branch_point, given what the run directory holds: `saved`, its config.yaml's
    train.branch_from; `trained`, whether it has a checkpoint of its own."""
    given = cfg.train.branch_from
    if saved is None or saved == given:
        return cfg
    if _same_branch_point(saved, given):
        if trained or storage.exists(str(saved).rstrip("/") + ".index"):
            return cfg.override({"train.branch_from": saved})
        return cfg
    if trained and storage.exists(rundir.path(stable_run_dir(saved), rundir.CONFIG_FILE)):  # (a moved run: as given)
        raise UserError(f"train.branch_from={given}: this branch ({cfg.run_dir}) started from {saved} (its "
                        f"{rundir.CONFIG_FILE}); resume it naming that checkpoint or its run, or branch into a new "
                        f"--output-dir")
    return cfg  # not trained yet: the branch point given now replaces the saved one


def pinned_step(branch_from: str) -> int | None:
    """The step of the checkpoint `train.branch_from` names (RUN/checkpoints/ckpt-N), or None for a run."""
    found = _CKPT.match(str(branch_from).rstrip("/").rsplit("/", 1)[-1])
    return int(found.group(1)) if found else None


def _absolute(path: str) -> str:
    """A local path made absolute (a later start may run in another working directory); a URL as it is."""
    return path if storage.is_remote(path) else os.path.abspath(path)


def _same_branch_point(saved: str | None, given: str | None) -> bool:
    """Whether `given` (this start's train.branch_from) names what the first start branched from:
    the same value, or the stable run whose checkpoint `saved` is (that start pinned it, `resolve`)."""
    if saved is None or given is None:
        return saved == given
    saved, given = _absolute(str(saved).rstrip("/")), _absolute(str(given).rstrip("/"))
    return saved == given or (pinned_step(given) is None and pinned_step(saved) is not None
                              and stable_run_dir(saved) == given)


def stable_data(shard_dir: str | None, tokenizer_path: str | None, run_dir: str,
                extension: tuple[int | None, str | None] = (None, None)) -> dict[str, str | None]:
    """The overrides that read the stable run's shards and tokenizer where this run names none
    (shard.dir, tokenizer.path unset): the only ones a branch may continue on, so typing them is no
    choice. The tokenizer is read as it is: the vocabulary extension this run names (`extension`:
    tokenizer.extend_tokens, add_tokens_file) is checked against it and cleared (`inherited_vocabulary`).
    Overrides, not a config: the caller that assembles the run applies them."""
    from tpu_ray.saved_config import read_saved_config

    if shard_dir and tokenizer_path:
        return {}
    source = read_saved_config(run_dir)
    if source is None:  # refused by _check_compatible, naming the missing config
        return {}
    over: dict[str, str | None] = {k: _where_it_is(run_dir, named, default) for k, named, default, given in (
        ("shard.dir", source.shard.dir, rundir.SHARDS_DIR, shard_dir),
        ("tokenizer.path", source.tokenizer.path, rundir.TOKENIZER_DIR, tokenizer_path)) if not given}
    if "tokenizer.path" in over:
        over.update(inherited_vocabulary(str(over["tokenizer.path"]), extension, run_dir))
    return over


def inherited_vocabulary(tokenizer_dir: str, extension: tuple[int | None, str | None],
                         run_dir: str) -> dict[str, None]:
    """The overrides that clear the vocabulary extension a branch names (`extension`: tokenizer.extend_tokens,
    add_tokens_file, as in a config copied from the stable run's) once it is the one the stable run's
    tokenizer (`tokenizer_dir`, which the branch reads) was made with, by its vocabulary_extension.json;
    else one line naming what differs. Why cleared: the branch must not learn or add tokens again (its
    checkpoint's embedding has the extended rows), and its config.yaml then records what it reads
    (tokenizer.path; config.py refuses an extension beside a tokenizer.path). Why checked: clearing an
    extension that is not the stable run's would train the branch on a vocabulary its config does not ask for."""
    count, tokens_file = extension
    if count is None and tokens_file is None:
        return {}
    from tpu_ray.prepare.vocabulary import EXTENSION_FILE, read_record, tokens_file_changed

    record = read_record(tokenizer_dir)
    out = "leave tokenizer.extend_tokens and tokenizer.add_tokens_file out"
    if record is None:
        field, value = ("extend_tokens", count) if count is not None else ("add_tokens_file", tokens_file)
        raise UserError(f"tokenizer.{field}={value}: the stable run this branch continues ({run_dir}) did not "
                        f"extend its vocabulary (its tokenizer {tokenizer_dir} has no {EXTENSION_FILE}); a branch reads "
                        f"that tokenizer as it is: {out}")
    theirs = {"extend_tokens": record.get("extend_tokens"), "add_tokens_file": record.get("add_tokens_file")}
    named = " ".join(f"tokenizer.{k}={_typed(v)}" for k, v in theirs.items())
    where = f"{run_dir}: {named}, in {storage.join(tokenizer_dir, EXTENSION_FILE)}"
    for field, mine, same in (("extend_tokens", count, count == theirs["extend_tokens"]),
                              ("add_tokens_file", tokens_file, _same_file(tokens_file, theirs["add_tokens_file"]))):
        if not same:
            fix = f"remove tokenizer.{field}" if theirs[field] is None else f"set tokenizer.{field}={theirs[field]}"
            raise UserError(f"tokenizer.{field}={_typed(mine)}: not the extension of the stable run this branch continues "
                            f"({where}); a branch reads that tokenizer as it is: {fix}, or {out}")
    if tokens_file_changed(record, tokens_file):
        raise UserError(f"tokenizer.add_tokens_file={tokens_file}: holds other tokens than when the stable run's "
                        f"tokenizer was extended from it (sha256 {record['add_tokens_sha256'][:12]}, {where}); a "
                        f"branch reads that tokenizer as it is: restore the file, or {out}")
    return {"tokenizer.extend_tokens": None, "tokenizer.add_tokens_file": None}


def _typed(value: object) -> str:
    """A setting's value as an override gives it (`null`, not Python's None)."""
    return "null" if value is None else str(value)


def _same_file(mine: str | None, theirs: str | None) -> bool:
    """The same tokens file: the same name, or two local names of one file."""
    if mine is None or theirs is None or mine == theirs:
        return mine == theirs
    local = not storage.is_remote(mine) and not storage.is_remote(theirs)
    return local and os.path.realpath(mine) == os.path.realpath(theirs)


def _where_it_is(run_dir: str, named: str | None, default: str) -> str:
    """The stable run's shards or tokenizer as found from where its config.yaml is (`run_dir`), never
    from the `output_dir` or name that config holds: a run moved, copied, or read from another working
    directory would otherwise point the branch at whatever lies at the old (relative) path, and the
    check that the branch reads the stable run's data would compare that path with itself."""

    if not named:  # the run's own directory: found beside its config.yaml
        base = run_dir if storage.is_remote(run_dir) else os.path.abspath(run_dir)
        return rundir.path(base, default)
    if storage.is_remote(named) or os.path.isabs(named):
        return named
    raise UserError(f"train.branch_from={run_dir}: the stable run names its {default} by a relative path "
                    f"({named!r}), which cannot be found from here; give shard.dir= and tokenizer.path= as "
                    f"absolute paths")


def _defaults(t: TrainConfig, stable: TrainConfig, step: int) -> dict[str, Any]:
    """The train fields `with_defaults` fills in, by name."""
    over: dict[str, Any] = {}
    if t.warmup_steps is None:
        over["warmup_steps"] = curves.warmup_steps(stable)
    if t.schedule == "wsd" and t.decay_steps is None and t.steps > step:
        over["decay_steps"] = t.steps - step
    return over


def with_defaults(t: TrainConfig, stable: TrainConfig, step: int) -> TrainConfig:
    """The branch's train section (`t`) with its unset warm-up the stable run's, and its wsd decay
    without decay_steps starting at the branch step. Why: those are the settings under which the
    branch continues the curve."""
    return _with(t, _defaults(t, stable, step))


def _with(t: TrainConfig, fields: dict[str, Any]) -> TrainConfig:
    """`t` with `fields` set, validated as the user's settings are (not a copy that skips the checks)."""
    return type(t).model_validate({**t.model_dump(), **fields}) if fields else t


def mask_rate_at(t: TrainConfig, step: int) -> float:
    """The masking rate of the batch at optimizer iteration `step` (a phase's mask_prob where set)."""
    start = span_at(phase_spans(t), step).mask_prob if t.phases else None
    return float(curves.mask_rate(t, step, start=start))


def lr_at(t: Any, step: int) -> float:
    return float(curves.rate(curves.curve(t), step))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= RTOL * max(abs(a), abs(b))


def continuity_refusal(stable: TrainConfig, branch: TrainConfig, step: int) -> str | None:
    """Where the branch's learning rate or masking rate at `step` is not the stable run's (their train
    sections): one line naming the rate, both values and the setting that makes them equal (None:
    continuous)."""
    a, b = lr_at(stable, step), lr_at(branch, step)
    if not _close(a, b):
        return (f"the learning rate jumps at the branch step {step:,} (the stable run's {a:.6g}, this run's "
                f"{b:.6g}); {_lr_fix(stable, branch, step, a)}")
    a, b = mask_rate_at(stable, step), mask_rate_at(branch, step)
    if not _close(a, b):
        return (f"the masking rate jumps at the branch step {step:,} (the stable run's {a:.6g}, this run's "
                f"{b:.6g}); {_mask_fix(branch, step, a)}")
    return None


def _lr_fix(stable: Any, t: Any, step: int, want: float) -> str:
    """The settings (each alone, then together) that give the branch the stable run's rate at `step`."""
    candidates: list[dict[str, Any]] = []
    if curves.warmup_steps(t) != curves.warmup_steps(stable):
        candidates.append({"warmup_steps": curves.warmup_steps(stable)})
    if t.learning_rate != stable.learning_rate:
        candidates.append({"learning_rate": stable.learning_rate})
    if t.schedule == "wsd":
        candidates.append({"decay_steps": t.steps - step})
    elif t.schedule in ("linear", "cosine"):
        candidates.append({"schedule": "wsd", "decay_steps": t.steps - step})
    together: dict[str, Any] = {}
    for c in candidates:
        together.update(c)
    for c in [*candidates, together]:
        # the settings as the user would give them, validated (not a copy that skips the checks)
        candidate = type(t).model_validate({**t.model_dump(), "warmup_steps": curves.warmup_steps(t), **c})
        if c and _close(lr_at(candidate, step), want):
            what = " ".join(f"train.{k}={v}" for k, v in c.items())
            why = " (the decay from the branch step)" if "decay_steps" in c else ""
            return f"set {what}{why}"
    return (f"branch at a step where the stable run holds its peak, or keep its schedule up to the branch step "
            f"({curves.describe(stable)}, train.steps={stable.steps})")


def _mask_fix(t: TrainConfig, step: int, want: float) -> str:
    """The setting that gives the branch (its train section `t`) the stable run's masking rate at `step`."""
    if t.mask_schedule == "linear" and step > 0:
        end = t.mask_prob + (want - t.mask_prob) * t.steps / step  # the line through the stable run's rate
        for value in _roundings(end):
            if 0 < value < 1 and _close(mask_rate_at(_with(t, {"mask_prob_end": value}), step), want):
                return (f"set train.mask_prob_end={value!r} (the same line through the stable run's rate, ending at "
                        f"train.steps={t.steps})")
        return f"set train.mask_schedule=constant train.mask_prob_end=null train.mask_prob={_short(want)}"
    if t.phases:
        i = span_at(phase_spans(t), step).index
        if t.phases[i].mask_prob is not None:
            return f"set train.phases[{i}].mask_prob={_short(want)}"
    return f"set train.mask_prob={_short(want)}"


def _roundings(x: float) -> list[float]:
    """`x` to 6, 10 and 17 significant digits: the shortest that passes the check is the one to print."""
    return [float(f"{x:.{d}g}") for d in (6, 10, 17)]


def _short(x: float) -> str:
    """The shortest rounding of `x` within a tenth of RTOL (what the user types passes the check)."""
    return repr(next(v for v in _roundings(x) if abs(v - x) <= RTOL / 10 * abs(x)))


def _check_compatible(spec: BranchSpec, data: dict[str, str], run_dir: str, where: str, step: int) -> RunConfig:
    """The stable run's saved config, once this run (`spec`, reading the shards and tokenizer `data`
    points at where it names none) may continue its checkpoint (else one line)."""
    from tpu_ray.saved_config import first_difference, read_saved_config

    source = read_saved_config(run_dir)
    if source is None:
        raise UserError(f"train.branch_from={where}: {run_dir} has no {rundir.CONFIG_FILE}; branch from a tpu-ray "
                        f"run directory")
    fix = f"branch with the stable run's config (its {rundir.CONFIG_FILE}), changing only the schedule"
    stable = source.branch_spec
    saved, mine = _comparable(stable), _comparable(spec)
    if spec.model.init_sha256 is None:  # a continued branch before its own copy: its hash is compared then
        saved["model"]["init_sha256"] = None
    diff = first_difference(saved, mine)
    if diff:
        raise UserError(f"train.branch_from={where}: the run was trained with another config ({diff}); {fix}")
    # train.phases: the same over the steps trained
    diff = trained_difference(spans(source.train, source.shard.seq_len), spans(spec.train, spec.shard.seq_len), step)
    if diff:
        raise UserError(f"train.branch_from={where}: train.phases differ from the stable run's over the {step:,} "
                        f"steps it trained ({diff}); keep its phases up to step {step} (the phase holding that "
                        f"step may end elsewhere, the phases after it are the branch's own)")
    # Both named now: this run's own, or the stable run's (stable_data).
    shards_dir = str(data.get("shard.dir", spec.shard.dir))
    tokenizer_dir = str(data.get("tokenizer.path", spec.tokenizer_path))
    if not storage.exists(_manifest_or_dir(shards_dir)):
        raise UserError(f"train.branch_from={where}: this run has no shards at {shards_dir}; read the stable "
                        f"run's: shard.dir={source.shards_dir} tokenizer.path={source.tokenizer_dir}")
    if not _same_shards(source.shards_dir, shards_dir):
        raise UserError(f"train.branch_from={where}: other shards ({shards_dir}, the run's are "
                        f"{source.shards_dir}); set shard.dir={source.shards_dir}")
    if _tokenizer_sha(source.tokenizer_dir) != _tokenizer_sha(tokenizer_dir):
        raise UserError(f"train.branch_from={where}: another tokenizer ({tokenizer_dir}, the run's is "
                        f"{source.tokenizer_dir}); set tokenizer.path={source.tokenizer_dir}")
    return source


def _comparable(spec: BranchSpec) -> dict[str, Any]:
    """The fingerprint's sections a branch shares with its stable run, less the schedule (the branch's
    own; phases: compared by trained_difference) and where the shards lie (the shards and the tokenizer
    themselves are compared instead), plus the data order's fields: the shuffle buffer and a mixture's
    weights. The corpus, the tokenizer and the evaluation are not compared."""
    train = {k: v for k, v in spec.train.fingerprint().items() if k not in (*SCHEDULE_FIELDS, "phases")}
    train.update({k: getattr(spec.train, k) for k in _DATA_ORDER})
    corpus = spec.corpus.model_dump(mode="json")
    return {"seed": spec.seed, "model": spec.model.model_dump(mode="json"), "train": train,
            "shard": {k: v for k, v in spec.shard.model_dump(mode="json").items() if k != "dir"},
            "mixture": {"weights": {n: src["weight"] for n, src in (corpus.get("sources") or {}).items()},
                        **{k: corpus.get(k) for k in ("weight_temperature", "weight_schedule")}}}


def _manifest_or_dir(shards_dir: str) -> str:
    from tpu_ray.prepare.shard_set import manifest_path

    manifest = manifest_path(shards_dir)
    return manifest if storage.exists(manifest) else shards_dir


def _same_shards(a: str, b: str) -> bool:
    """The same directory, or manifests with the same contents (a copy of the shards)."""
    if not storage.is_remote(a) and not storage.is_remote(b) and os.path.realpath(a) == os.path.realpath(b):
        return True
    ma, mb = _manifest_or_dir(a), _manifest_or_dir(b)
    return ma != a and mb != b and storage.read_text(ma) == storage.read_text(mb)


def _tokenizer_sha(tokenizer_dir: str) -> str | None:
    from tpu_ray.prepare.tokenizer import tokenizer_info

    try:
        return tokenizer_info(tokenizer_dir).sha256
    except UserError:
        return None


def restore(checkpoint: str, stable_run: str, s: Any, metrics: Any) -> int:
    """Load the branch `checkpoint` (of run `stable_run`: `resolve`'s Branch, which the trainer
    resolves for a fresh branch) into this run's objects (`s`: loop.TrainSetup), record this run's
    schedule (`s.recorded`) in it, and return its step, where the branch starts."""
    from tpu_ray.train import schedule as lr_schedule

    with tempfile.TemporaryDirectory(prefix="tpu-ray-branch-") as tmp:
        prefix = _local_copy(checkpoint, tmp)
        status = s.checkpoint.restore(prefix)
        status.assert_existing_objects_matched()
        status.expect_partial()  # schedule_shape: absent from checkpoints written before curves had shapes
    lr_schedule.adopt(s.checkpoint, s.recorded)
    step = int(s.step_var.numpy())
    log.info("branched from %s at step %d (%s)", checkpoint, step, stable_run)
    metrics.event("branch", stage="train", step=step, checkpoint=checkpoint, source=stable_run)
    return step


def _local_copy(prefix: str, tmp: str) -> str:
    """A gs:// checkpoint's files staged under `tmp` (TF reads local files); a local one as it is."""
    if not storage.is_remote(prefix):
        return prefix
    directory, name = prefix.rsplit("/", 1)
    for path in storage.listdir(directory):
        base = path.rsplit("/", 1)[-1]
        if base.startswith(name + "."):
            storage.download_file(path, os.path.join(tmp, base))
    return os.path.join(tmp, name)
