"""Helpers the tests call (not fixtures): paths, a slice of the real corpus, the suite's Ray cluster,
a tiny run config. Fixtures stay in conftest.py."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext-2"


def wikitext_slice(tmp_path_factory, nbytes: int, name: str) -> Path:
    """The first ~nbytes of WikiText-2's validation text, cut at a line boundary, as a new file."""
    data = (WIKITEXT / "valid.txt").read_bytes()[:nbytes]
    path = tmp_path_factory.mktemp(name.split(".")[0]) / name
    path.write_bytes(data[: data.rfind(b"\n") + 1])
    return path


def start_local_ray():
    """The suite's real local Ray cluster (2 CPUs, no dashboard), started if it is not running.

    address="local": always a fresh cluster of our own, never one a `ray start` left running.
    Tests that build a multi-node `Cluster` run in a process of their own (own_process) instead.
    """
    import gc

    import ray

    if not ray.is_initialized():
        gc.collect()  # ObjectRefs of an earlier cluster freed now, not inside the new session
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    return ray


def tiny_config(run_dir: Path, corpus: Path, **overrides):
    """A RunConfig for fast CPU tests (tiny model, short sequences)."""
    from tpu_ray.config import RunConfig

    base = {
        "name": "t", "output_dir": str(run_dir),
        "corpus": {"source": str(corpus), "validation_fraction": 0.1},
        "tokenizer": {"vocab_size": 800},
        "shard": {"seq_len": 64, "unit_bytes": 65536},
        "model": {"preset": "tiny"},
        "train": {"steps": 20, "batch_size": 16, "learning_rate": 1e-3, "warmup_steps": 2, "log_every": 5,
                  "eval_every": 10, "checkpoint_every": 10, "shuffle_buffer": 256},
        "eval": {"samples": 32},
    }
    cfg = RunConfig.from_dict(base)
    return cfg.override(overrides) if overrides else cfg


def manifest_json(shards_dir: str) -> dict | None:
    """The manifest as written (its raw JSON, for tests asserting what the shard stage wrote), or None."""
    import json

    from tpu_ray import storage
    from tpu_ray.prepare.shard_set import manifest_path

    path = manifest_path(str(shards_dir))
    return json.loads(storage.read_text(path)) if storage.exists(path) else None


def shard_files(shards_dir: str, split: str) -> list[tuple[str, int]]:
    """(path, samples) of a split, as training takes them: a complete manifest's, or by shard names."""
    from tpu_ray.prepare.shard_set import ShardSet

    shards = ShardSet.open(str(shards_dir))
    shards.require_complete()
    return shards.files(split)


def save_tiny_roberta(tok, out: Path, max_positions: int) -> str:
    """A tiny RoBERTa masked LM (hidden 32, one layer) over `tok`'s vocabulary, saved with `tok` the
    way RUN/model is (weights + tokenizer): what the downstream tests fine-tune."""
    from transformers import RobertaConfig, TFRobertaForMaskedLM

    config = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=max_positions, pad_token_id=1)
    model = TFRobertaForMaskedLM(config)
    model(model.dummy_inputs)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return str(out)


def stable_run_and_branch(tmp_path, corpus):
    """A stable run directory as a branch finds it (config.yaml, shards/, a committed ckpt-4; no
    weights: what is checked before any loads) and a wsd branch of it naming no shards or tokenizer."""
    from tpu_ray.saved_config import save_config

    stable = tiny_config(tmp_path / "stable", corpus, **{"train.schedule": "constant", "train.steps": 12})
    save_config(stable, False, {})
    (tmp_path / "stable" / "shards").mkdir()
    ckpts = tmp_path / "stable" / "checkpoints"
    ckpts.mkdir()
    (ckpts / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\n')
    (ckpts / "ckpt-4.index").write_bytes(b"")
    branch = stable.override({"output_dir": str(tmp_path / "branch"), "train.branch_from": str(tmp_path / "stable"),
                              "train.schedule": "wsd"})
    return stable, branch


def train_cfg(**train):
    """A default RunConfig with these train.* settings, validated as a run's is (for the pure
    decisions that read only the train section: placement, strategy)."""
    from tpu_ray.config import RunConfig

    return RunConfig.from_dict({"train": train})
