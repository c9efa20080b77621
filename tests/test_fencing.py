"""Two writers after a partition: an older training attempt that recovery gave up on,
still alive, can neither commit nor prune the replacement's checkpoints. Real TF checkpoints, a
real local directory and a real GCS emulator; no training loop (the store is what commits)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def _store(directory: str, value: float, keep: int = 1):
    import tensorflow as tf

    from tpu_ray.train.checkpoints import CheckpointStore
    from tpu_ray.train.generation import Generation

    generation = Generation(directory)
    generation.claim()
    ckpt = tf.train.Checkpoint(w=tf.Variable(value))
    return CheckpointStore(ckpt, directory, keep, generation=generation, skip_busy=False), generation


@pytest.mark.parametrize("where", ["local", "gs"])
def test_an_older_attempt_cannot_commit_or_prune_the_newer_ones_checkpoints(where, tmp_path, request):
    import tensorflow as tf

    from tpu_ray import storage
    from tpu_ray.errors import FailureKind, UserError

    directory = (f"{request.getfixturevalue('gcs_emulator').make_bucket()}/run/checkpoints" if where == "gs"
                 else str(tmp_path / "run" / "checkpoints"))
    old, old_gen = _store(directory, 1.0)
    old.save(1, final=True)  # the old attempt's last commit before the partition
    new, new_gen = _store(directory, 2.0)  # recovery's replacement: the next generation
    assert (old_gen.mine, new_gen.mine) == (1, 2)
    new.save(2, final=True)
    with pytest.raises(UserError) as refused:  # the old attempt, still alive, saves again (keep=1 would prune ckpt-2)
        old.save(3, final=True)
        old.close()
    assert refused.value.kind is FailureKind.SUPERSEDED and not refused.value.kind.retryable
    line = str(refused.value)
    assert "training attempt 1 was superseded by attempt 2" in line and "\n" not in line, line
    new.save(4, final=True)
    new.close()
    state = storage.read_text(storage.join(directory, "checkpoint"))
    assert 'model_checkpoint_path: "ckpt-4"' in state and "ckpt-3" not in state
    names = {p.rstrip("/").rsplit("/", 1)[-1] for p in storage.listdir(directory)}
    assert "ckpt-4.index" in names and "ckpt-3.index" not in names
    if where == "local":
        assert float(tf.train.load_checkpoint(f"{directory}/ckpt-4").get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE")) == 2.0
