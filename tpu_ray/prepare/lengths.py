"""Where each sequence length's shard set lives: `shard.seq_len` in the shard directory itself,
every other length of `train.phases` in a folder of its own (the sharding stage cuts the same train
tokens at each). The sharding stage writes this layout and training reads it, so it lives here, below
both.
"""

from __future__ import annotations

from tpu_ray.config import PhaseConfig


def subdir(seq_len: int) -> str:
    """The folder (inside the shard directory) of the shards cut at a phase's shorter length (as
    config.RunPaths.shards_at names it)."""
    return f"seq-{seq_len}"


def extra_lengths(phases: list[PhaseConfig] | None, seq_len: int) -> tuple[int, ...]:
    """The lengths of `train.phases` other than `shard.seq_len` (`seq_len`): each a shard set of its
    own, `subdir(L)` (config.RunPaths.shards_at(L) says where)."""
    return tuple(sorted({p.seq_len for p in phases or []} - {seq_len}))
