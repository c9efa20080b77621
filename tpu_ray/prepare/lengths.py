"""Where each sequence length's shard set lives: `shard.seq_len` in the shard directory itself,
every other length of `train.phases` in a folder of its own (the sharding stage cuts the same train
tokens at each). The sharding stage writes this layout and training reads it, so it lives here, below
both.
"""

from __future__ import annotations

from tpu_ray.config import RunConfig


def subdir(seq_len: int) -> str:
    """The folder (inside the shard directory) of the shards cut at a phase's shorter length (as
    config.RunPaths.shards_at names it)."""
    return f"seq-{seq_len}"


def extra_lengths(cfg: RunConfig) -> tuple[int, ...]:
    """The phase lengths other than `shard.seq_len`: each a shard set of its own, `subdir(L)`."""
    return tuple(sorted({p.seq_len for p in cfg.train.phases or []} - {cfg.shard.seq_len}))


def shards_dir(cfg: RunConfig, seq_len: int) -> str:
    """Where the shards a phase at `seq_len` trains on are."""
    return cfg.paths.shards_at(seq_len)
