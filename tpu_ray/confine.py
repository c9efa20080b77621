"""One rule for every path a record or manifest names: it stays inside its directory.

A run's records (RUN/init/source.json, the shard manifest, a safetensors index) are files that
whoever can write the run's folder can edit. A name taken from one and joined to a local
directory (`tmp / rel`, `cache / sha256`) must never reach outside it: `../../.bashrc`, an
absolute path or a URL would make the next host that stages the copy write (or delete) a file
anywhere its user can. Every such join goes through `confined`.
"""

from __future__ import annotations

import os

from tpu_ray.errors import DamagedRunDir


def is_confined(rel: str) -> bool:
    """True for a relative path that stays inside its directory (no '..', no absolute path or URL,
    no control character): a manifest's `../../etc/hostname` must never be read, written or blamed."""
    if not isinstance(rel, str) or not rel or rel.startswith(("/", "\\")) or "://" in rel or "\\" in rel \
            or ":" in rel.split("/", 1)[0]:
        return False
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in rel):  # a newline would split the one-line errors
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def confined(base: str | os.PathLike, rel: str, record: str, fix: str) -> str:
    """`base/rel` when `rel` (a name `record` holds) stays inside `base`; else DamagedRunDir in one
    line naming the record, the name and `fix`."""
    if not is_confined(rel):
        raise DamagedRunDir(f"{record}: names {str(rel)[:80]!r}, which is not a path inside its directory "
                            f"(damaged, or written by someone else); {fix}")
    return os.path.join(os.fspath(base), *rel.split("/"))
