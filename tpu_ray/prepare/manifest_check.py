"""A shard manifest read from disk is input: its shape checked, its paths kept inside the shard dir."""

from __future__ import annotations

from typing import Any

from tpu_ray.errors import UserError


def check_manifest(manifest: Any, path: str) -> None:
    """The manifest's shape, and every shard path confined to the shard directory: a manifest is
    input (copied, edited, downloaded), and `../../etc/hostname` must not be read or blamed."""
    fix = "delete it to rebuild the shards"
    splits = manifest.get("splits") if isinstance(manifest, dict) else None
    if not isinstance(splits, dict) or not all(isinstance(splits.get(s), dict) for s in ("train", "validation")):
        raise UserError(f"{path}: not a tpu-ray shard manifest (no train/validation splits); {fix}")
    for split in ("train", "validation"):
        shards = splits[split].get("shards")
        if not isinstance(shards, list):
            raise UserError(f"{path}: {split}.shards is not a list; {fix}")
        for i, entry in enumerate(shards):
            name = entry.get("path") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not isinstance(entry.get("samples"), int):
                raise UserError(f"{path}: {split}.shards[{i}] lacks a path or a sample count; {fix}")
            if not is_confined(name):
                raise UserError(f"{path}: {split}.shards[{i}] path {name!r} points outside the shard directory; "
                                f"the manifest was edited or is not from tpu-ray: {fix}")


def is_confined(rel: str) -> bool:
    """True for a relative path that stays inside its directory (no '..', no absolute path or URL)."""
    if not rel or rel.startswith(("/", "\\")) or "://" in rel or "\\" in rel or ":" in rel.split("/", 1)[0]:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))
