"""The evaluation set spans the corpus (issue 21 item 4): not the first units' validation shards."""

from __future__ import annotations

import numpy as np

from tpu_ray.prepare.tfrecord import examples_file
from tpu_ray.train.inputs import MaskSpec, eval_dataset, eval_files


def test_eval_files_are_spread_over_the_whole_corpus_and_suffice():
    val = [(f"v-{i:05d}", 10) for i in range(100)]  # 100 units' validation shards, 10 samples each
    picked = eval_files(val, 35, seed=0)
    assert sum(10 for _ in picked) >= 35 and len(picked) == 4
    index = sorted(int(p[2:]) for p in picked)
    assert index[0] < 25 and index[-1] >= 75  # first and last quarter of the corpus both seen
    assert eval_files(val, 35, seed=0) == picked  # the same set at every evaluation
    assert eval_files(val, 35, seed=3) != picked  # the seed moves the spread
    assert eval_files(val, 10_000, seed=0) == sorted(p for p, _ in val)  # more than exists: all of it
    assert eval_files([], 10, seed=0) == []


def test_one_eval_batch_mixes_every_picked_file(tmp_path):
    files = []
    for i in range(4):  # every record of file i holds token 10 + i
        path = tmp_path / f"validation-{i:05d}-8.tfrecord"
        path.write_bytes(examples_file(np.full((8, 6), 10 + i, dtype=np.int32)))
        files.append(str(path))
    spec = MaskSpec(mask_prob=0.15, mask_id=4, vocab_size=100, special_ids=(0, 1, 2, 3, 4))
    batch = next(iter(eval_dataset(files, 6, 4, spec, seed=0, max_batches=1)))
    # Each row's most common id is its file's token (a masked position may show [MASK] or another id).
    rows = {int(np.bincount(row).argmax()) for row in batch["input_ids"].numpy()}
    assert rows == {10, 11, 12, 13}  # read in file order, the batch would be four rows of file 0
