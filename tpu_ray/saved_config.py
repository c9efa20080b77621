"""Which config a run directory belongs to: config.yaml, checked part by part.

Why part by part: a refused command (a batch not divisible by the replicas, a missing field in a
jsonl corpus) must not block its own fix in the same directory. Only what the directory already
holds pins the config: a tokenizer pins the corpus and tokenizer sections, shards pin those and the
shard section, checkpoints pin everything that shapes the model (RunConfig.fingerprint). A change
to a part nothing depends on yet replaces the saved config, with a log line saying so.
"""

from __future__ import annotations

import json
import logging
import platform
import time

import yaml

from tpu_ray import storage
from tpu_ray.config import SCHEDULE_FIELDS, RunConfig, RunPaths, ShardConfig, TokenizerConfig
from tpu_ray.errors import DamagedRunDir, UserError
from tpu_ray.rundir import CONFIG_FILE, MANIFEST_FILE, RUN_INFO_FILE, TOKENIZER_FILE, checkpoint_files, path
from tpu_ray.redact import redact, redact_obj

log = logging.getLogger("tpu_ray")

# What each artifact of a run depends on: the saved config may change freely elsewhere.
_PINNED_BY = {
    "tokenizer": ("corpus", "tokenizer"),
    "shards": ("corpus", "tokenizer", "shard"),
    "checkpoints": None,  # everything in the fingerprint
}


def held_artifacts(tokenizer: TokenizerConfig, shard: ShardConfig, paths: RunPaths) -> list[str]:
    """Which of the run's own tokenizer, shards and checkpoints exist (not external tokenizer.path/shard.dir)."""
    held = []
    if not tokenizer.path and storage.exists(path(paths.tokenizer_dir, TOKENIZER_FILE)):
        held.append("tokenizer")
    if not shard.dir and storage.exists(path(paths.shards_dir, MANIFEST_FILE)):
        held.append("shards")
    if checkpoint_files(paths.run_dir):
        held.append("checkpoints")
    return held


def read_saved_config(run_dir: str) -> RunConfig | None:
    """The config the run directory was made with, or None for a new directory."""
    saved_path = path(run_dir, CONFIG_FILE)
    if not storage.exists(saved_path):
        return None
    try:
        data = yaml.safe_load(storage.read_text(saved_path))
    except IsADirectoryError:
        raise DamagedRunDir(f"{saved_path}: is a directory, not the saved config; remove it, or use a new "
                            f"--output-dir") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise DamagedRunDir(f"{saved_path}: cannot read the saved config ({type(exc).__name__}); "
                            f"use a new --output-dir") from None
    if not isinstance(data, dict) or not data:  # empty or cut to a scalar: damage, not "all defaults"
        raise DamagedRunDir(f"{saved_path}: the saved config is empty or not a mapping (damaged); restore it, "
                            f"or use a new --output-dir")
    try:
        return RunConfig.from_dict(data, origin=saved_path)  # its one line names saved_path already
    except UserError as exc:
        raise DamagedRunDir(str(exc)) from None


def check_config(cfg: RunConfig) -> bool:
    """Refuse a directory whose artifacts were made with another config; True if config.yaml must
    be (re)written (new directory, or a change only to parts nothing there depends on yet)."""
    saved = read_saved_config(cfg.run_dir)
    if saved is None:
        return True

    old, new = redact_obj(saved.fingerprint()), redact_obj(cfg.fingerprint())  # config.yaml holds user:***
    if old == new:
        return False
    for artifact in held_artifacts(cfg.tokenizer, cfg.shard, cfg.paths):
        sections = _PINNED_BY[artifact]
        a = old if sections is None else {k: old.get(k) for k in sections}
        b = new if sections is None else {k: new.get(k) for k in sections}
        if sections is None and cfg.train.extend_schedule:  # checkpoints continue under a new schedule
            a, b = _without_schedule(a), _without_schedule(b)
        if cfg.model.init_from:  # taken from the checkpoint (init_from.checkpoint_fields), pinned by its hash
            a, b = _without_checkpoint_derived(a), _without_checkpoint_derived(b)
        diff = first_difference(a, b)
        if diff:
            made = "was" if artifact == "tokenizer" else "were"
            raise UserError(f"{cfg.run_dir}: this run directory belongs to a different config ({diff}); the "
                            f"{artifact} here {made} made with the saved one ({CONFIG_FILE}); use a new "
                            f"--output-dir or the original config")
    log.info("%s: replacing the saved config (%s); nothing in the directory depends on it yet",
             cfg.run_dir, first_difference(old, new))
    return True


def _without_checkpoint_derived(fingerprint: dict) -> dict:
    """A continued run's fingerprint without what the checkpoint decides (tokenizer.kind and
    vocab_size, model.preset): a run saved before they were filled in holds the defaults there."""
    out = dict(fingerprint)
    for section, keys in (("tokenizer", ("kind", "vocab_size")), ("model", ("preset",))):
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in keys}
    return out


def _without_schedule(fingerprint: dict) -> dict:
    return {**fingerprint, "train": {k: v for k, v in fingerprint["train"].items() if k not in SCHEDULE_FIELDS}}


def save_config(cfg: RunConfig, resume: bool, versions: dict[str, str], command: str = "") -> None:
    """Write config.yaml and run_info.json (after the stage's checks passed); `command` is what the
    model card names as the command that made the run."""
    storage.makedirs(cfg.run_dir)

    # Passwords in URLs are kept out of the run's files (user:***); check_config compares redacted.
    storage.atomic_write_text(path(cfg.run_dir, CONFIG_FILE), redact(cfg.to_yaml()))
    storage.atomic_write_text(path(cfg.run_dir, RUN_INFO_FILE),
                              json.dumps({"versions": versions, "resume": resume, "started": time.time(),
                                          "host": platform.node(), "command": redact(command)}, indent=1) + "\n")


def first_difference(a: dict, b: dict, prefix: str = "") -> str:
    """The first differing dotted key of two nested dicts, as `key: saved X, now Y` ("" if equal)."""
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            found = first_difference(va, vb, f"{prefix}{key}.")
            if found:
                return found
        elif va != vb:
            return f"{prefix}{key}: saved {va!r}, now {vb!r}"
    return ""

