"""Continued pretraining: start a run from a published or earlier checkpoint (`model.init_from`).

Sources, in the order they are recognised:
- a tpu-ray run directory (config.yaml + checkpoints/): its last committed checkpoint, its tokenizer;
- a directory laid out as Hugging Face repositories ship it (config.json + tf_model.h5 or a
  PyTorch-layout model.safetensors, + tokenizer files), local or gs:// (a tpu-ray RUN/model is one);
- a name already in the local Hugging Face cache (`roberta-base`, `org/name`): the real
  `snapshot_download(local_files_only=True)`, never a download.

Why the weights are read here and not by `TFAutoModelForMaskedLM.from_pretrained`: the model is
built inside the strategy's scope like any other run (same variables, same checkpoint object), and
Transformers 4.57's TF loading of PyTorch-layout safetensors is broken (#40028). tf_model.h5 goes
through transformers' own `load_tf_weights`; model.safetensors is read with `safetensors.numpy`
and renamed/transposed by transformers' pure-Python name mapping (the inverse of our export):
never torch. The architecture and sizes are the checkpoint's; the optimizer and schedule start
fresh (what continued pretraining means); a resumed continued run restores its own checkpoints.

A run owns what it starts from: its first stage copies the checkpoint (weights, config.json,
tokenizer files; a run directory's last checkpoint) into RUN/init/ with source.json (the source as
written and a sha256 of the content, also kept as model.init_sha256 in config.yaml and in
summary.json). From then on every stage, --resume, every TPU host and every recovery attempt read
that copy: the source may move, change or vanish. A gs:// source is fetched through a per-user
cache keyed by its objects' generations, so a re-upload is a new fetch, never the old copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_ray import rundir, storage
from tpu_ray.confine import confined
from tpu_ray.config import InitSpec, ModelConfig, RunConfig, RunPaths, TokenizerConfig  # noqa: F401 - InitSpec: its callers' name for it
from tpu_ray.errors import DamagedRunDir, UserError, first_line
from tpu_ray.resume import copy_start
from tpu_ray.families import FAMILIES, family
from tpu_ray.confine import is_confined

log = logging.getLogger(__name__)

WEIGHT_FILES = ("tf_model.h5", "model.safetensors", "model.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt", "sentencepiece.bpe.model", "spiece.model", "spm.model", "added_tokens.json")
# Size fields a checkpoint fixes: (our config field, the transformers config attribute).
SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "max_position_embeddings")
FIX_COPY = "remove the run's init/ folder and run again with model.init_from in place to copy it again"
FIX = "give model.init_from a Hugging Face model directory (config.json, weights, tokenizer) or a tpu-ray run"


@dataclass(frozen=True)
class Source:
    """A resolved checkpoint: `kind` "hf" (a model directory, local copy in `local`), "run" (a
    tpu-ray run directory) or "copy" (the run's own RUN/init copy: config.json, tokenizer files,
    and weights or checkpoints/)."""

    kind: str
    where: str  # as the user wrote it, for messages
    local: str  # local directory (a staged copy of a gs:// one)
    root: str = ""  # what a file's link may point into (the Hub cache's repository folder); "" = `local`


def resolve(init_from: str) -> Source:
    """Where `init_from` points: a run directory, a model directory (local or gs://), or a cached name."""
    if storage.exists(rundir.path(init_from, rundir.CONFIG_FILE)) and storage.exists(
            rundir.path(init_from, rundir.CHECKPOINTS_DIR)):
        return Source("run", init_from, init_from)
    if storage.exists(storage.join(init_from, "config.json")):
        local = _stage_remote(init_from) if storage.is_remote(init_from) else init_from
        return Source("hf", init_from, local)
    if storage.is_remote(init_from) or storage.exists(init_from):
        raise UserError(f"model.init_from={init_from}: no config.json here (nor a tpu-ray run: config.yaml + "
                        f"checkpoints/); {FIX}")
    snapshot = _from_hf_cache(init_from)  # snapshots/REV/NAME are links to ../../blobs/HASH of the repository
    return Source("hf", init_from, snapshot, root=str(Path(snapshot).parent.parent))


def _from_hf_cache(name: str) -> str:
    """The local snapshot of a Hub name, from the cache only (HF_HUB_CACHE / HF_HOME)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # huggingface_hub comes with transformers; without it no cache to read
        raise UserError(f"model.init_from={name}: not a directory, and huggingface_hub is not installed to read "
                        f"the Hugging Face cache; {FIX}") from None
    try:
        return snapshot_download(repo_id=name, local_files_only=True)
    except (LocalEntryNotFoundError, ValueError, OSError) as exc:
        raise UserError(f"model.init_from={name}: not a directory and not in the local Hugging Face cache "
                        f"({first_line(exc)[:120]}); download it first (huggingface-cli download {name}) or "
                        f"{FIX}") from None


def user_cache() -> Path:
    """tpu-ray's cache for this user ($XDG_CACHE_HOME/tpu-ray, else ~/.cache/tpu-ray), mode 0700.

    Why not a fixed path in the shared temporary directory: another user could plant files there
    (or read them); a directory this user does not own is not used, one it owns is made private."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = Path(base) / "tpu-ray"
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = root.stat()
        if st.st_uid == os.getuid() and not root.is_symlink():
            if st.st_mode & 0o077:
                root.chmod(0o700)
            return root
        log.warning("%s: not this user's own directory; using a private temporary one", root)
    except OSError as exc:
        log.warning("%s: cannot use it as a cache (%s); using a private temporary one", root, first_line(exc))
    global _PRIVATE_TMP
    if _PRIVATE_TMP is None:
        _PRIVATE_TMP = Path(tempfile.mkdtemp(prefix="tpu-ray-cache-"))  # mode 0700, this process only
    return _PRIVATE_TMP


_PRIVATE_TMP: Path | None = None


def _stage_remote(url: str) -> str:
    """A local copy of a gs:// model directory (its top-level files), cached per user by the
    objects' generations (or content hashes): a model re-uploaded to the same URL is fetched anew."""
    listing = storage.glob_info(storage.join(url, "*"))
    versions = sorted((path.rstrip("/").rsplit("/", 1)[-1], str(meta.get("generation") or meta.get("md5Hash")
                                                                 or meta.get("crc32c") or meta.get("etag") or ""),
                       int(meta.get("size") or 0)) for path, meta in listing.items())
    key = hashlib.sha256(json.dumps([url, versions]).encode()).hexdigest()[:32]
    cache = user_cache() / "init-from"
    target = cache / key
    if target.is_dir():
        return str(target)
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = Path(tempfile.mkdtemp(prefix="staging-", dir=cache))
    try:
        for path in listing:
            storage.download_file(path, str(tmp / path.rstrip("/").rsplit("/", 1)[-1]))
        os.rename(tmp, target)  # complete once renamed
    except OSError:
        if not target.is_dir():  # not "another process staged it first"
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


# --- the run's own copy (RUN/init) ----------------------------------------------------------------
def init_dir(run_dir: str) -> str:
    return rundir.path(run_dir, rundir.INIT_DIR)


def read_record(run_dir: str) -> dict[str, Any] | None:
    """RUN/init/source.json (what the run copied, from where, its hashes), or None before the copy."""
    path = rundir.path(run_dir, rundir.INIT_DIR, rundir.INIT_RECORD_FILE)
    if not storage.exists(path):
        return None
    try:
        data = json.loads(storage.read_text(path))
    except (ValueError, UnicodeDecodeError, OSError) as exc:
        data = exc
    again = f"remove {init_dir(run_dir)} and run again with the source in place to copy it again"
    ok = isinstance(data, dict) and isinstance(data.get("source"), str) and _is_sha256(data.get("sha256")) \
        and isinstance(data.get("files"), dict) and all(map(_is_sha256, data["files"].values()))
    if not ok:
        raise DamagedRunDir(f"{path}: not the record of the run's copy of model.init_from (damaged); {again}")
    for rel in data["files"]:  # each is joined to a local directory: never outside it
        confined(init_dir(run_dir), rel, path, again)
    return data


def _is_sha256(value: Any) -> bool:
    """A sha256 as hexdigest() writes it (it is used as a directory name: nothing else passes)."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _record_fits(record: dict[str, Any], model: ModelConfig) -> bool:
    return record["source"] == model.init_from and model.init_sha256 in (None, record["sha256"])


def source_for(spec: InitSpec) -> Source:
    """What this run initialises from: its own copy in RUN/init once its first stage made it (the
    source itself is never read again), else a branch's stable run's copy of the same source, else
    model.init_from itself."""
    record = read_record(spec.paths.run_dir)
    if record is not None and _record_fits(record, spec.model):
        return _copy_source(spec.paths.run_dir, record)
    if stable := _stable_copy(spec):
        return _copy_source(*stable)
    return resolve(str(spec.model.init_from))


def _stable_copy(spec: InitSpec) -> tuple[str, dict[str, Any]] | None:
    """A branch off a continued run (train.branch_from): the stable run's directory and the record of
    its copy of this same source (why: the source may be gone since; the copy is what it trained from)."""
    if not spec.branch_from:
        return None
    from tpu_ray.train.branch import stable_run_dir

    run_dir = stable_run_dir(spec.branch_from)
    record = read_record(run_dir)
    return (run_dir, record) if record is not None and _record_fits(record, spec.model) else None


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def content_hash(files: dict[str, str]) -> str:
    """One sha256 for a copy: of its files' relative names and sha256s."""
    return hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()


_VERIFIED: set[tuple] = set()


def _verify(local: str, record: dict[str, Any], where: str) -> None:
    """Every file the record lists is there with its recorded hash (once per process and file state)."""
    state = []
    for rel in sorted(record["files"]):
        path = os.path.join(local, rel)
        try:
            st = os.stat(path)
        except OSError:
            raise DamagedRunDir(f"{storage.join(where, rel)}: missing from the run's copy of model.init_from; "
                                f"remove {where} and run again with the source in place to copy it again") from None
        state.append((rel, st.st_size, st.st_mtime_ns))
    key = (local, tuple(state))
    if key in _VERIFIED:
        return
    for rel, want in record["files"].items():
        if file_sha256(os.path.join(local, rel)) != want:
            raise DamagedRunDir(f"{storage.join(where, rel)}: differs from the sha256 in {rundir.INIT_RECORD_FILE} "
                                f"(damaged); remove {where} and run again with the source in place to copy it again")
    _VERIFIED.add(key)


def _copy_source(run_dir: str, record: dict[str, Any]) -> Source:
    where = init_dir(run_dir)
    if not storage.is_remote(where):
        _verify(where, record, where)
        return Source("copy", where, where)
    target = user_cache() / "run-init" / record["sha256"]  # content-addressed: never stale
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = Path(tempfile.mkdtemp(prefix="staging-", dir=target.parent))
        try:
            for rel in record["files"]:
                local = confined(tmp, rel, storage.join(where, rundir.INIT_RECORD_FILE), FIX_COPY)
                os.makedirs(os.path.dirname(local), exist_ok=True)
                storage.download_file(storage.join(where, rel), local)
            _verify(str(tmp), record, where)
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _verify(str(target), record, where)
    return Source("copy", where, str(target))


def own_copy(spec: InitSpec) -> str:
    """Copy what model.init_from holds into RUN/init (the first stage, under the run's lock; a copy
    already there for this source is kept) and return its hash, for model.init_sha256 (the caller
    sets it in the run's config, so config.yaml records it).

    Files are committed one by one, source.json last: a copy cut short is never taken as complete."""
    run_dir = spec.paths.run_dir
    record = read_record(run_dir)
    if record is not None and _record_fits(record, spec.model):
        _copy_source(run_dir, record)  # verified: a damaged copy stops here, in one line
        return record["sha256"]
    if stable := _stable_copy(spec):  # a branch: the stable run's copy, file for file
        return _copy_of_stable(run_dir, *stable)
    src = resolve(str(spec.model.init_from))
    where = init_dir(run_dir)
    local_run = not storage.is_remote(run_dir)
    if local_run:
        storage.makedirs(run_dir)
    staging = tempfile.mkdtemp(prefix=".init-staging-", dir=run_dir if local_run else None)
    try:
        _gather_source(src, staging)
        files = {os.path.relpath(os.path.join(d, n), staging).replace(os.sep, "/"): file_sha256(os.path.join(d, n))
                 for d, _, names in os.walk(staging) for n in names}
        digest = content_hash(files)
        pin = spec.model.init_sha256
        if pin and pin != digest:
            raise UserError(f"model.init_sha256={pin}: {src.where} now holds other content (sha256 {digest}); "
                            f"point model.init_from at the checkpoint of that hash, or drop model.init_sha256")
        if storage.exists(where):  # a copy of another source (nothing here depends on it: the config check passed)
            storage.remove(where, recursive=True)
        for rel in sorted(files):
            storage.atomic_copy_file(os.path.join(staging, rel), storage.join(where, rel))
        # Where the copy's steps stand globally, recorded while its source is there to read (a parent
        # run moved or gone later would otherwise count from its checkpoint alone).
        start = copy_start(where, src.local if src.kind == "run" else None)
        record = {"source": spec.model.init_from, "kind": src.kind, "resolved": src.local, "sha256": digest,
                  "files": files, "copied": time.time(), "global_start": start}
        storage.atomic_write_text(rundir.path(where, rundir.INIT_RECORD_FILE), json.dumps(record, indent=1) + "\n")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("init_from: copied %s (%d files, sha256 %s) -> %s; the run reads this copy from now on",
             src.where, len(files), digest[:12], where)
    return digest


def _copy_of_stable(own_run_dir: str, run_dir: str, record: dict[str, Any]) -> str:
    """RUN/init (of `own_run_dir`) as the stable run's verified copy (same files, same hash),
    source.json last; returns the hash."""
    src = _copy_source(run_dir, record)
    where = init_dir(own_run_dir)
    if storage.exists(where):
        storage.remove(where, recursive=True)
    local_run = not storage.is_remote(own_run_dir)
    if local_run:
        storage.makedirs(own_run_dir)
    staging = tempfile.mkdtemp(prefix=".init-staging-", dir=own_run_dir if local_run else None)
    try:  # each file copied first: committing moves a local file, and the stable run keeps its copy
        for rel in sorted(record["files"]):
            staged = os.path.join(staging, rel)
            os.makedirs(os.path.dirname(staged), exist_ok=True)
            shutil.copyfile(os.path.join(src.local, rel), staged)
            storage.atomic_copy_file(staged, storage.join(where, rel))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    mine = {**record, "copied": time.time(), "via": src.where}
    storage.atomic_write_text(rundir.path(where, rundir.INIT_RECORD_FILE), json.dumps(mine, indent=1) + "\n")
    log.info("init_from: copied the stable run's copy %s (sha256 %s) -> %s", src.where, record["sha256"][:12], where)
    return record["sha256"]


def _gather_source(src: Source, out: str) -> None:
    """The checkpoint's files into `out`: config.json, tokenizer files, and its weights (a model
    directory's weight files; a run directory's last committed checkpoint under checkpoints/)."""
    if src.kind == "run":
        _gather_run(src, out)
        return
    present = [n for n in WEIGHT_FILES if os.path.exists(os.path.join(src.local, n))]
    if not present:
        raise UserError(f"model.init_from={src.where}: no weights (tf_model.h5 or model.safetensors); {FIX}")
    names = {"config.json", *present, *(n for n in TOKENIZER_FILES if os.path.exists(os.path.join(src.local, n)))}
    if "model.safetensors.index.json" in present and "model.safetensors" not in present:
        names |= set(_index_shards(src))
    for name in sorted(names):
        _copy_own_file(src.where, src.root or src.local, os.path.join(src.local, name), os.path.join(out, name))


def _copy_own_file(where: str, root: str, path: str, dst: str) -> None:
    """Copy `path` (a file of the model directory `root`) to `dst`. Locally a link is followed only
    into `root` itself: a cloned model repository shipping `vocab.txt -> ~/.netrc` must not put
    that file into RUN/model, which the model card tells people to publish."""
    if storage.is_remote(path):
        storage.download_file(path, dst)
        return
    real, inside = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, inside]) != inside:
        raise UserError(f"{where}: {os.path.basename(path)} is a link to {real}, outside the model directory; a "
                        f"checkpoint's files must be its own: replace the link by the file it should be "
                        f"(cp --remove-destination TARGET {path}) or remove it")
    shutil.copyfile(real, dst)


def _index_shards(src: Source) -> list[str]:
    """The shard files a model.safetensors.index.json names: plain file names beside it only."""
    index = os.path.join(src.local, "model.safetensors.index.json")
    try:
        weight_map = json.loads(Path(index).read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{src.where}/model.safetensors.index.json: not a readable weight index "
                        f"({first_line(exc)[:120]}); download or export it again") from None
    for name in shards:
        if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
            raise UserError(f"{src.where}/model.safetensors.index.json: weight file {name!r} is not a file name "
                            f"beside the index; the index must name files in its own directory")
    return shards


def _gather_run(src: Source, out: str) -> None:
    """A tpu-ray run directory: its model's config.json, its tokenizer, its last committed checkpoint."""
    from tpu_ray.train.checkpoints import pick_latest

    Path(out, "config.json").write_text(json.dumps(source_hf_config(src).to_dict(), indent=1, default=str),
                                        encoding="utf-8")
    tok_dir = _run_config(src).tokenizer_dir
    for name in TOKENIZER_FILES:
        if storage.exists(storage.join(tok_dir, name)):
            _copy_own_file(src.where, tok_dir, storage.join(tok_dir, name), os.path.join(out, name))
    directory = rundir.checkpoints_dir(src.local)
    names = set(rundir.checkpoint_files(src.local)) - {rundir.CHECKPOINT_STATE_FILE}
    state_path = storage.join(directory, rundir.CHECKPOINT_STATE_FILE)
    state = storage.read_text(state_path) if storage.exists(state_path) else None
    chosen, _ = pick_latest(directory, state, names)
    if chosen is None:
        raise UserError(f"model.init_from={src.where}: the run has no committed checkpoint yet; train it first "
                        f"or point at another run")
    ckpt_out = os.path.join(out, rundir.CHECKPOINTS_DIR)
    os.makedirs(ckpt_out)
    for name in sorted(n for n in names if n.startswith(chosen + ".")):
        _copy_own_file(src.where, directory, storage.join(directory, name), os.path.join(ckpt_out, name))
    Path(ckpt_out, rundir.CHECKPOINT_STATE_FILE).write_text(
        f'model_checkpoint_path: "{chosen}"\nall_model_checkpoint_paths: "{chosen}"\n', encoding="utf-8")


# --- the checkpoint's config ----------------------------------------------------------------------
def _read_config_json(src: Source) -> dict[str, Any]:
    path = os.path.join(src.local, "config.json")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{src.where}/config.json: not a readable model config ({first_line(exc)}); {FIX}") from None
    if not isinstance(data, dict):
        raise UserError(f"{src.where}/config.json: not a JSON object; {FIX}")
    return data


def _run_config(src: Source) -> RunConfig:
    cfg = RunConfig.from_yaml(rundir.path(src.local, rundir.CONFIG_FILE))
    return cfg.override({"output_dir": src.local})


def source_hf_config(src: Source):
    """The transformers config of the checkpoint (its own config.json, or the run's model)."""
    from transformers import AutoConfig

    if src.kind == "run":  # a run continued from a checkpoint has that checkpoint's config
        from tpu_ray.prepare.tokenizer import tokenizer_info
        from tpu_ray.train.model_config import scratch_hf_config

        run_cfg = _run_config(src)
        if run_cfg.model.init_from:  # that run's own copy of its checkpoint (or its source, before one)
            from tpu_ray.prepare.vocabulary import read_record

            config = source_hf_config(source_for(run_cfg.init_spec))
            if (record := read_record(run_cfg.tokenizer_dir)) is not None:  # its vocabulary grew
                config.vocab_size = record["vocab_size"]
            return config
        return scratch_hf_config(run_cfg.model, tokenizer_info(run_cfg.tokenizer_dir), run_cfg.max_positions(),
                                 run_cfg.shard.seq_len, run_cfg.tokenizer_dir)
    data = _read_config_json(src)
    model_type = data.get("model_type")
    if model_type not in FAMILIES:
        family(str(model_type), where=f"{src.where}/config.json: model_type")  # raises the one line
    try:
        return AutoConfig.for_model(**data)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{src.where}/config.json: not a valid {model_type} config ({first_line(exc)}); {FIX}") from None


def checkpoint_hf_config(spec: InitSpec):
    """The model config of `model.init_from` (called by train.model.hf_config)."""
    return source_hf_config(source_for(spec))


def _sizes(config: Any, model_type: str) -> dict[str, int]:
    fam = family(model_type)
    out = {}
    for key in SIZE_FIELDS:
        name = fam.size_fields.get(key, key)
        value = getattr(config, name, None) if name else None
        if isinstance(value, int):
            out[key] = value
    return out


def checkpoint_fields(spec: InitSpec) -> dict[str, Any]:
    """The config overrides that make the run's config the checkpoint's: its model type and sizes
    (explicit sizes that disagree are refused; shard.seq_len must fit its position embeddings), and
    what a continued run takes from what it trains (_as_trained). Once the run holds its copy
    (RUN/init) that copy is read and its hash fills in model.init_sha256. The caller that assembles
    the run applies them (`cfg.override(...)`): one config, resolved once, for every stage."""
    src = source_for(spec)
    if src.kind == "hf" and not any(os.path.exists(os.path.join(src.local, f)) for f in WEIGHT_FILES):
        raise UserError(f"model.init_from={src.where}: no weights (tf_model.h5 or model.safetensors); {FIX}")
    config = source_hf_config(src)
    model_type = config.model_type
    m = spec.model
    if m.model_type != model_type and m.model_type != "roberta":  # roberta is the default, not a choice
        raise UserError(f"model.model_type={m.model_type}: the checkpoint {src.where} is a {model_type}; "
                        f"leave model.model_type out (the checkpoint decides) or set it to {model_type}")
    sizes = _sizes(config, model_type)
    for key, value in sizes.items():
        mine = getattr(m, key)
        if mine is not None and mine != value:
            raise UserError(f"model.{key}={mine}: the checkpoint {src.where} has {key}={value}; "
                            f"leave model.{key} out (the checkpoint's sizes are the model)")
    overrides: dict[str, Any] = {"model.model_type": model_type, **_as_trained(spec, sizes)}
    if src.kind == "copy":  # the run's own copy, or a branch's stable run's
        own = read_record(spec.paths.run_dir)
        record = own if own is not None and _record_fits(own, spec.model) else _stable_copy(spec)[1]
        overrides["model.init_sha256"] = record["sha256"]
    overrides.update({f"model.{k}": v for k, v in sizes.items()})
    eps = getattr(config, "layer_norm_eps", None)
    if isinstance(eps, float) and 0 < eps < 1:
        overrides["model.layer_norm_eps"] = eps
    fam = family(model_type)
    positions = sizes.get("max_position_embeddings")
    seq_len = spec.paths.seq_len
    if positions is not None and seq_len + fam.position_offset > positions:
        raise UserError(f"shard.seq_len={seq_len}: the checkpoint {src.where} has {positions} position "
                        f"embeddings ({model_type} positions start at {fam.position_offset}); use shard.seq_len <= "
                        f"{positions - fam.position_offset}")
    tk = spec.tokenizer  # the overrides leave the tokenizer's files where they are
    if tk.add_tokens_file and not storage.exists(storage.join(spec.paths.tokenizer_dir, "tokenizer.json")):
        from tpu_ray.prepare.vocabulary import Speller, file_tokens

        file_tokens(tk.add_tokens_file, Speller(base_tokenizer_json(spec)))  # bad input: before any write
    return overrides


def _as_trained(spec: InitSpec, sizes: dict[str, int]) -> dict[str, Any]:
    """The config fields a continued run takes from what it trains: tokenizer.kind and vocab_size of
    the tokenizer it uses (the checkpoint's, or tokenizer.path), model.preset when the
    checkpoint's sizes are a preset's, and the fresh-start fields at their defaults. Why: config.yaml, the model card and `doctor` read them, and
    a continued config leaves their defaults in (a "unigram 8000, preset tiny" card for a BPE-2000
    hidden-128 model, and a doctor FAIL comparing 8000 tokens with 2000 embedding rows)."""
    from tokenizers import Tokenizer

    from tpu_ray.config import MODEL_PRESETS
    from tpu_ray.prepare.tokenizer import load_tokenizer_json

    path = spec.tokenizer.path
    text = load_tokenizer_json(path) if path else base_tokenizer_json(spec)
    out: dict[str, Any] = {}
    kind = {"BPE": "bpe", "Unigram": "unigram", "WordPiece": "wordpiece"}.get(json.loads(text)["model"].get("type"))
    if kind:
        out["tokenizer.kind"] = kind
    size = Tokenizer.from_str(text).get_vocab_size(with_added_tokens=True)
    if 64 <= size <= 1_000_000:  # tokenizer.vocab_size's bounds
        out["tokenizer.vocab_size"] = size
    preset = next((name for name, p in MODEL_PRESETS.items() if all(sizes.get(k) == v for k, v in p.items())), None)
    if preset:
        out["model.preset"] = preset
    # A fresh model's start does not apply to trained weights: left in from a fresh run's config
    # (the quickstart's), they would name a start that never happened and hold a resume to it.
    out["model.output_bias"] = "zeros"
    out["model.initializer_range"] = None
    return out


# --- the checkpoint's tokenizer -------------------------------------------------------------------
def _tokenizer_dir(src: Source) -> str:
    if src.kind == "run":
        run_cfg = _run_config(src)
        return run_cfg.tokenizer_dir
    return src.local


def copy_tokenizer(spec: InitSpec, plan_sample: Callable[[], Callable[[], Iterable[list[str]]]],
                   force: bool = False):
    """Validate the checkpoint's tokenizer and copy it to the run's tokenizer directory (the shards
    then record its hash). Returns its TokenizerInfo. `plan_sample()`: plans the corpus and returns
    what reads the sample an extension learns from (the caller's: it holds the corpus; called only
    when the run extends the vocabulary)."""
    from tpu_ray.prepare.tokenizer import TOKENIZER_FILE, tokenizer_info

    out = spec.paths.tokenizer_dir
    if not force and storage.exists(storage.join(out, TOKENIZER_FILE)):
        info = tokenizer_info(out)
        check_tokenizer(spec, info, out, directory=out)
        return info
    src = source_for(spec)
    tok_dir = _tokenizer_dir(src)
    with tempfile.TemporaryDirectory(prefix="tpu-ray-tok-") as tmp:
        _gather_tokenizer(src, tok_dir, tmp)
        info = tokenizer_info(tmp)
        check_tokenizer(spec, info, f"{src.where} tokenizer", base=True)
        if extends(spec.tokenizer):
            _extend(spec, info, tmp, plan_sample)
            info = tokenizer_info(tmp)
            check_tokenizer(spec, info, out, directory=tmp)
        storage.makedirs(out)
        names = sorted(os.listdir(tmp), key=lambda n: n == TOKENIZER_FILE)  # tokenizer.json last: complete
        for name in names:
            storage.atomic_copy_file(os.path.join(tmp, name), storage.join(out, name))
    log.info("tokenizer: the checkpoint's (%s), vocab %d, sha256 %s -> %s", src.where, info.vocab_size,
             info.sha256[:12], out)
    return tokenizer_info(out)


def extends(tokenizer: TokenizerConfig) -> bool:
    """Whether the run adds tokens to its checkpoint's vocabulary (prepare/vocabulary.py)."""
    return bool(tokenizer.extend_tokens or tokenizer.add_tokens_file)


def _extend(spec: InitSpec, info: Any, tmp: str, plan_sample: Callable[[], Callable[[], Iterable[list[str]]]]) -> None:
    """The checkpoint's tokenizer in `tmp`, extended with the tokens the run asks for."""
    from tpu_ray.prepare.vocabulary import extend

    rows = _rows(spec)
    if info.vocab_size != rows:
        raise UserError(f"model.init_from={spec.model.init_from}: its embedding has {rows} rows for a vocabulary of "
                        f"{info.vocab_size} (padded); tokenizer.extend_tokens / add_tokens_file need them equal")
    extend(tmp, spec.tokenizer, plan_sample())


def base_tokenizer_json(spec: InitSpec) -> str:
    """The checkpoint's own tokenizer.json (what an extended tokenizer grew from)."""
    src = source_for(spec)
    tok_dir = _tokenizer_dir(src)
    path = storage.join(tok_dir, "tokenizer.json")
    if storage.exists(path):
        return storage.read_text(path)
    with tempfile.TemporaryDirectory(prefix="tpu-ray-tok-") as tmp:  # slow files only: converted as copied
        _gather_tokenizer(src, tok_dir, tmp)
        return Path(tmp, "tokenizer.json").read_text(encoding="utf-8")


def _gather_tokenizer(src: Source, tok_dir: str, tmp: str) -> None:
    """The tokenizer files into `tmp`; a checkpoint without tokenizer.json (slow tokenizer files
    only) is converted once by transformers' AutoTokenizer into a fast one."""
    present = [n for n in TOKENIZER_FILES if storage.exists(storage.join(tok_dir, n))]
    if "tokenizer.json" in present:
        for name in present:
            _copy_own_file(src.where, tok_dir, storage.join(tok_dir, name), os.path.join(tmp, name))
        return
    if not present:
        raise UserError(f"{src.where}: no tokenizer files (tokenizer.json, vocab.txt, ...); the checkpoint's "
                        f"tokenizer is needed to continue its pretraining; add it to the directory")
    from transformers import AutoTokenizer

    try:
        fast = AutoTokenizer.from_pretrained(tok_dir, use_fast=True)
        fast.save_pretrained(tmp)
    except Exception as exc:  # transformers raises many kinds for a tokenizer it cannot convert
        raise UserError(f"{src.where}: cannot make a fast tokenizer from its files ({first_line(exc)[:120]}); "
                        f"add its tokenizer.json") from None
    for name in os.listdir(tmp):
        if name not in TOKENIZER_FILES:
            os.remove(os.path.join(tmp, name))


def _rows(spec: InitSpec) -> int:
    return int(checkpoint_hf_config(spec).vocab_size)


def check_tokenizer(spec: InitSpec, info: Any, where: str, directory: str | None = None, base: bool = False) -> None:
    """Vocabulary == embedding rows (or padded up to a multiple of 8..128 as some checkpoints are),
    or exactly the checkpoint's vocabulary plus the tokens its extension record (in `directory`)
    names; the special tokens are the family's convention. `base`: the checkpoint's own tokenizer,
    before any extension the run asks for."""
    from tpu_ray.prepare.vocabulary import EXTENSION_FILE, check_growth, read_record, tokens_file_changed

    rows = _rows(spec)
    tk = spec.tokenizer
    record = read_record(directory) if directory else None
    if record is not None:
        check_growth(record, storage.read_text(storage.join(directory, "tokenizer.json")), base_tokenizer_json(spec),
                     rows, where)
        rows = record["vocab_size"]
        asked = (tk.extend_tokens, tk.add_tokens_file)
        if extends(tk) and asked != (record.get("extend_tokens"), record.get("add_tokens_file")):
            raise UserError(f"{where}: extended with tokenizer.extend_tokens={record.get('extend_tokens')} "
                            f"add_tokens_file={record.get('add_tokens_file')} ({EXTENSION_FILE}), not as this run "
                            f"asks; make it again with `tpu-ray tokenizer --force`")
        if tokens_file_changed(record, tk.add_tokens_file):
            raise UserError(f"{where}: extended from tokenizer.add_tokens_file={tk.add_tokens_file} as it was "
                            f"(sha256 {record['add_tokens_sha256'][:12]}, {EXTENSION_FILE}); the file has changed "
                            f"since; restore it, or make the tokenizer again (`tpu-ray tokenizer --force`, before shards) or "
                            f"use a new --output-dir")
    elif extends(tk) and not base:
        raise UserError(f"{where}: the checkpoint's tokenizer, not extended as tokenizer.extend_tokens / "
                        f"add_tokens_file ask; make it with `tpu-ray tokenizer --force`")
    padded = info.vocab_size < rows and any(rows % m == 0 and rows - info.vocab_size < m for m in (8, 16, 32, 64, 128))
    if info.vocab_size != rows and not padded:
        raise UserError(f"{where}: vocabulary of {info.vocab_size} tokens, but the checkpoint's embedding has "
                        f"{rows} rows; use the tokenizer the checkpoint was trained with")
    fam = family(spec.model.model_type)
    if info.special_tokens != fam.tokens.as_tuple() and spec.model.model_type != "albert":
        log.info("tokenizer %s: special tokens %s (family %s convention: %s)", where, " ".join(info.special_tokens),
                 fam.model_type, " ".join(fam.tokens.as_tuple()))
    if fam.required_pad_id is not None and info.pad_id != fam.required_pad_id:
        raise UserError(f"{where}: pad token {info.tokens.pad} has id {info.pad_id}, but TF {fam.model_type} "
                        f"treats id {fam.required_pad_id} as padding; use the checkpoint's own tokenizer")


# --- the checkpoint's weights ---------------------------------------------------------------------
def load_weights(model: Any, spec: InitSpec) -> str:
    """Load the checkpoint's weights into the built `model`; every model weight must be found.
    Returns a description of what was read."""
    config = checkpoint_hf_config(spec)
    if int(model.config.vocab_size) != int(config.vocab_size):  # an extended vocabulary: load, then grow
        from tpu_ray.train.grow import load_grown

        return load_grown(model, config, lambda old: _load_source(old, spec), spec.paths.tokenizer_dir,
                          str(spec.model.init_from))
    return _load_source(model, spec)


def _load_source(model: Any, spec: InitSpec) -> str:
    src = source_for(spec)
    if src.kind == "run" or (src.kind == "copy" and os.path.isdir(os.path.join(src.local, rundir.CHECKPOINTS_DIR))):
        return _load_run_checkpoint(model, src)
    h5 = os.path.join(src.local, "tf_model.h5")
    st = os.path.join(src.local, "model.safetensors")
    index = st + ".index.json"
    if os.path.exists(h5):
        _load_h5(model, h5, src)
        return h5
    if os.path.exists(st) or os.path.exists(index):
        _load_safetensors(model, st, index, src)
        return st if os.path.exists(st) else index
    raise UserError(f"model.init_from={src.where}: no weights (tf_model.h5 or model.safetensors); {FIX}")


def _load_h5(model: Any, path: str, src: Source) -> None:
    from transformers.modeling_tf_utils import load_tf_weights

    try:
        missing, _unexpected, mismatched = load_tf_weights(model, path)
    except Exception as exc:  # h5py raises OSError for a truncated file, others for damage
        raise UserError(f"{src.where}/tf_model.h5: cannot read the weights ({first_line(exc)[:120]}); the file is "
                        f"damaged or truncated: download or export it again") from None
    if missing or mismatched:
        what = f"{len(missing)} layer(s) missing (e.g. {missing[0]})" if missing else \
            f"shape mismatch at {mismatched[0][0]}"
        raise UserError(f"{src.where}/tf_model.h5: {what}; the weights do not fit its config.json")


def _load_safetensors(model: Any, path: str, index: str, src: Source) -> None:
    from safetensors.numpy import load_file
    from transformers.modeling_tf_pytorch_utils import load_pytorch_state_dict_in_tf2_model

    files = [path] if os.path.exists(path) else _index_files(index, src)
    state: dict[str, Any] = {}
    for f in files:
        try:
            state.update(load_file(f))
        except Exception as exc:  # safetensors raises SafetensorError (truncated header or data), TypeError (bf16)
            raise UserError(f"{src.where}/{os.path.basename(f)}: cannot read the weights ({first_line(exc)[:120]}); "
                            f"the file is damaged or truncated: download or export it again") from None
    _fill_tied(state, model.config.model_type)
    try:
        _, info = load_pytorch_state_dict_in_tf2_model(
            model, state, allow_missing_keys=True, output_loading_info=True, skip_logger_warnings=True,
            tf_to_pt_weight_rename=getattr(model, "tf_to_pt_weight_rename", None))
    except Exception as exc:  # a shape that does not fit raises InvalidArgumentError
        raise UserError(f"{src.where}/model.safetensors: weights do not fit config.json ({first_line(exc)[:160]})") from None
    if info["missing_keys"]:
        raise UserError(f"{src.where}/model.safetensors: {len(info['missing_keys'])} weight(s) missing (e.g. "
                        f"{info['missing_keys'][0]}); the file does not hold this {model.config.model_type} model")


def _index_files(index: str, src: Source) -> list[str]:
    """The weight files a sharded-safetensors index names, each inside the model directory: an
    absolute path or `../` in `weight_map` must never make us read a file elsewhere."""
    where = f"{src.where}/{os.path.basename(index)}"
    try:
        weight_map = json.loads(Path(index).read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UserError(f"{where}: not a safetensors index (no weight_map of file names); download or export "
                        f"it again") from None
    root = os.path.realpath(src.local)
    files = []
    for name in names:
        full = os.path.realpath(os.path.join(src.local, name)) if isinstance(name, str) else ""
        if not isinstance(name, str) or not is_confined(name) or os.path.dirname(full) != root:
            raise UserError(f"{where}: weight_map names {str(name)[:80]!r}, which is not a file of the model "
                            f"directory; fix the index (file names only) or download the model again")
        files.append(full)
    return files


def _fill_tied(state: dict[str, Any], model_type: str) -> None:
    """The tied weights a PyTorch save drops (ALBERT's decoder bias, MobileBERT's decoder) that TF
    keeps as variables of their own: set to the weight PyTorch ties them to (families.pt_tied)."""
    fam = FAMILIES.get(model_type)
    for dropped, kept in fam.pt_tied if fam else ():
        if dropped not in state and kept in state:
            state[dropped] = state[kept]


def _load_run_checkpoint(model: Any, src: Source) -> str:
    import tensorflow as tf

    from tpu_ray.train.checkpoints import CheckpointStore

    ckpt = tf.train.Checkpoint(model=model)
    store = CheckpointStore(ckpt, rundir.checkpoints_dir(src.local), keep=1, write=False)
    try:
        if store.latest is None and store.problem is None:
            raise UserError(f"model.init_from={src.where}: the run has no committed checkpoint yet; train it first "
                            f"or point at another run")
        store.restore(ckpt, partial=True)
        return store.latest_url or src.where
    finally:
        store.close(wait=False)
