"""Which sequence lengths get a shard set of their own: `shard.seq_len` in the shard directory itself,
every other length of `train.phases` in a folder of its own (config.RunPaths.shards_at: the sharding
stage cuts the same train tokens at each and training reads them there).
"""

from __future__ import annotations

from tpu_ray.config import PhaseConfig


def extra_lengths(phases: list[PhaseConfig] | None, seq_len: int) -> tuple[int, ...]:
    """The lengths of `train.phases` other than `shard.seq_len` (`seq_len`): each a shard set of its
    own, in the folder config.RunPaths.shards_at(L) names."""
    return tuple(sorted({p.seq_len for p in phases or []} - {seq_len}))
