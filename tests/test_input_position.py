"""The seekable training stream: resuming anywhere repeats and skips nothing, in the same order."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import tiny_config
from tpu_ray.prepare.tfrecord import serialize_examples, write_records

COUNTS = (37, 29, 41, 23)  # ragged: windows and batches cross file ends


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("seek")
    out = []
    for i, n in enumerate(COUNTS):
        rows = np.full((n, 8), 0, dtype=np.int64)
        rows[:, 1] = i
        rows[:, 2] = np.arange(n)  # (file, record) identifies every sample
        path = d / f"train-{i:05d}-{n}.tfrecord"
        with open(path, "wb") as f:
            write_records(f, serialize_examples(rows))
        out.append(str(path))
    return out


def _ids(ds, n: int) -> list[tuple[int, int]]:
    import tensorflow as tf

    spec = {"input_ids": tf.io.FixedLenFeature([8], tf.int64)}
    out = []
    for rec in ds.take(n):
        ids = tf.io.parse_single_example(rec, spec)["input_ids"].numpy()
        out.append((int(ids[1]), int(ids[2])))
    return out


@pytest.mark.parametrize("start", [0, 1, 16, 17, 129, 130, 131, 260 + 45])
@pytest.mark.quick
def test_a_stream_started_anywhere_continues_the_uninterrupted_one(files, start):
    from tpu_ray.train.input_position import seekable_records

    n = sum(COUNTS)
    whole = _ids(seekable_records(files, COUNTS, seed=3, window=16), 3 * n)
    resumed = _ids(seekable_records(files, COUNTS, seed=3, window=16, start_sample=start), 3 * n - start)
    assert resumed == whole[start:]
    for epoch in range(3):  # every epoch holds each record exactly once
        assert sorted(whole[epoch * n:(epoch + 1) * n]) == sorted((i, r) for i, c in enumerate(COUNTS)
                                                                   for r in range(c))
    assert whole[:n] != whole[n:2 * n]  # a new order every epoch
    assert whole[:n] != sorted(whole[:n])  # and a shuffled one


@pytest.mark.quick
def test_the_position_names_epoch_window_and_offset(files):
    from tpu_ray.train.input_position import position_at, shards_digest

    pos = position_at(step=10, samples=130 + 40, counts=COUNTS, window=16, digest=shards_digest(files, COUNTS))
    assert (pos.epoch, pos.sample_in_epoch, pos.window, pos.offset) == (1, 40, 2, 8)


@pytest.mark.quick
def test_resume_refuses_a_changed_data_order_unless_accepted(files):
    """The hosts (input pipelines) and train.shuffle_buffer decide the order as much as
    the shards do. A v4-8 run (1 pipeline) resumed on a v4-16 (2), or with another shuffle buffer,
    is refused in one line naming what changed; train.accept_new_data_order=true continues at the
    same step in the new order."""
    from tpu_ray.errors import UserError
    from tpu_ray.train.input_position import PositionTracker

    train_files = list(zip(files, COUNTS))

    def tracker(pipelines: int, window: int) -> PositionTracker:
        t = PositionTracker(train_files, global_batch=16, window=window)
        t.bind(files[: len(files) // pipelines], pipelines)
        return t

    stored = tracker(1, 16).at(7).to_json()
    assert tracker(1, 16).check_resume(stored, 7, "ckpt-7").samples == 7 * 16  # same order: continue exactly
    for other, what in ((tracker(2, 16), "input pipelines (hosts) 1 -> 2"),
                        (tracker(1, 32), "train.shuffle_buffer 16 -> 32")):
        with pytest.raises(UserError) as refused:
            other.check_resume(stored, 7, "ckpt-7")
        line = str(refused.value)
        assert line.startswith(f"--resume: ckpt-7 was trained in another data order ({what})"), line
        assert "train.accept_new_data_order=true" in line and "\n" not in line
        accepted = other.check_resume(stored, 7, "ckpt-7", accept_new_order=True)
        assert accepted == other.at(7) and accepted.shuffle_window == other.window


@pytest.mark.slow  # three short trainings, ~2.5 min on 2 cores
def test_resume_with_dropout_0_ends_with_the_weights_of_an_uninterrupted_run(tmp_path, files, tiny_tokenizer_dir,
                                                                           monkeypatch):
    """Train 12 steps; train 6, then resume to 12: the same weights (exact order and masks), the
    stored position names the resume point, and the resume event says where in the epoch it was."""
    import tensorflow as tf

    from tpu_ray.train.checkpoints import CheckpointStore
    from tpu_ray.train.loop import train

    from tests.test_train import write_shards
    from tpu_ray.prepare.tokenizer import tokenizer_info

    shards = tmp_path / "shards"
    write_shards(shards, tokenizer_info(tiny_tokenizer_dir).vocab_size)
    over = {"tokenizer.path": tiny_tokenizer_dir, "shard.dir": str(shards), "model.dropout": 0.0,
            "train.log_every": 3, "train.eval_every": 100, "train.checkpoint_every": 6, "train.shuffle_buffer": 16}

    def final_weights(run: Path) -> str:
        reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run / "checkpoints")))
        names = sorted(k for k in reader.get_variable_to_shape_map() if k.startswith("model/"))
        digest = hashlib.sha256()
        for k in names:
            digest.update(reader.get_tensor(k).tobytes())
        return digest.hexdigest()

    straight = tiny_config(tmp_path / "straight", tmp_path / "x.txt", **over, **{"train.steps": 12})
    train(straight)
    cut = tiny_config(tmp_path / "cut", tmp_path / "x.txt", **over, **{"train.steps": 12})
    real_save = CheckpointStore.save

    def crash_after_step_6(self, step, position=None, final=False):
        real_save(self, step, position, final)
        raise KeyboardInterrupt("simulated loss of the node after the checkpoint of step 6")

    monkeypatch.setattr(CheckpointStore, "save", crash_after_step_6)
    with pytest.raises(KeyboardInterrupt):
        train(cut)
    monkeypatch.setattr(CheckpointStore, "save", real_save)
    stored = json.loads((tmp_path / "cut" / "checkpoints" / "ckpt-6.position.json").read_text())
    assert stored["samples"] == 6 * 16 and stored["epoch"] == 0 and stored["sample_in_epoch"] == 96
    summary = train(cut, resume=True)
    assert summary["resumed_from"] == 6
    events = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    resume = [e for e in events if e.get("event") == "resume"]
    assert resume and resume[0]["step"] == 6 and resume[0]["sample_in_epoch"] == 96
    assert final_weights(tmp_path / "cut") == final_weights(tmp_path / "straight")


SHARES = (37, 29, 41, 23, 50)  # 5 ragged shards, 180 records: 45 per pipeline on 4


@pytest.fixture(scope="module")
def five_files(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("five")
    out = []
    for i, n in enumerate(SHARES):
        rows = np.full((n, 8), 7, dtype=np.int64)
        rows[:, 1] = 10 + i
        rows[:, 2] = 100 + np.arange(n)  # (file, record) identifies every sample
        path = d / f"train-{i:05d}-{n}.tfrecord"
        with open(path, "wb") as f:
            write_records(f, serialize_examples(rows))
        out.append(str(path))
    return out


def _pipeline_samples(files: list[str], pipeline: int, batches: int, start_batch: int = 0) -> list[tuple[int, int]]:
    """The (file, record) of every sample pipeline `pipeline` of 4 feeds, read through train_dataset
    (masking undone: a masked position's label holds its id)."""
    import tensorflow as tf

    from tpu_ray.train.inputs import IGNORE, MaskSpec, train_dataset

    ctx = tf.distribute.InputContext(num_input_pipelines=4, input_pipeline_id=pipeline, num_replicas_in_sync=4)
    spec = MaskSpec(0.15, mask_id=3, vocab_size=200, special_ids=(0, 1, 2, 3, 4))
    ds = train_dataset(files, 8, 5, spec, seed=11, shuffle_buffer=16, start_batch=start_batch, ctx=ctx,
                       counts={f: n for f, n in zip(files, SHARES)})
    out = []
    for batch in ds.take(batches):
        ids = tf.where(batch["labels"] != IGNORE, batch["labels"], batch["input_ids"]).numpy()
        out += [(int(r[1]), int(r[2])) for r in ids]
    return out


def test_every_sample_is_seen_equally_often_on_4_pipelines_of_5_shards(five_files):
    """Every pipeline feeds 5 samples a step; 90 steps are 10 epochs of 45-record shares,
    so every sample is seen exactly 10 times (round-robin files gave pipeline 0 two shards, 66
    records, each seen about half as often as the others)."""
    from collections import Counter

    seen = Counter()
    for p in range(4):
        seen.update(_pipeline_samples(five_files, p, 90))
    every = {(10 + i, 100 + r) for i, n in enumerate(SHARES) for r in range(n)}
    assert set(seen) == every
    assert set(seen.values()) == {10}, sorted(Counter(seen.values()).items())


@pytest.mark.quick
def test_a_pipeline_share_that_starts_inside_a_file_resumes_exactly(five_files):
    """Pipeline 1's share starts inside the second file: resuming at batch 13 continues the stream."""
    whole = _pipeline_samples(five_files, 1, 30)
    assert _pipeline_samples(five_files, 1, 17, start_batch=13) == whole[13 * 5:]


@pytest.mark.quick
def test_a_position_stored_under_round_robin_files_is_another_order(files):
    """A multi-host run resumed from a position stored before hosts shared records (no `split`) is
    in another data order: refused unless accepted, as for any changed order."""
    from tpu_ray.errors import UserError
    from tpu_ray.train.input_position import PositionTracker

    t = PositionTracker(list(zip(files, COUNTS)), global_batch=16, window=16)
    t.bind(files[:2], 2)
    old = json.loads(t.at(7).to_json())
    old.pop("split")
    with pytest.raises(UserError, match="whole files round-robin -> equal record ranges"):
        t.check_resume(json.dumps(old), 7, "ckpt-7")
