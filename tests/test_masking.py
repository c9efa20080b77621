"""TF-native masking: rates, the 80/10/10 split, special tokens, labels, determinism, static shapes."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tpu_ray.train.inputs import IGNORE, MaskSpec, mask_tokens  # noqa: E402 (after importorskip)

SPEC = MaskSpec(mask_prob=0.15, mask_id=4, vocab_size=1000, special_ids=(0, 1, 2, 3, 4))


def _batch(seed=0, shape=(256, 128)):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 1000, size=shape)
    ids[:, 0] = 0  # [CLS]
    ids[:, -1] = 2  # [SEP]
    ids[:, 60:64] = 1  # padding
    ids[::7, 30] = 3  # <unk>
    return tf.constant(ids, tf.int32)


@pytest.mark.quick
def test_mask_statistics_on_a_large_batch():
    ids = _batch()
    masked, labels = (t.numpy() for t in mask_tokens(ids, tf.constant([1, 2], tf.int64), SPEC))
    orig = ids.numpy()
    special = np.isin(orig, SPEC.special_ids)
    selected = labels != IGNORE
    rate = selected.sum() / (~special).sum()
    assert abs(rate - 0.15) < 0.01, rate
    assert not (selected & special).any(), "a special or padding token was selected"
    np.testing.assert_array_equal(labels[selected], orig[selected])
    assert (labels[~selected] == IGNORE).all()
    assert (masked[~selected] == orig[~selected]).all(), "unselected tokens must stay unchanged"
    n = selected.sum()
    to_mask = (masked == SPEC.mask_id) & selected
    unchanged = (masked == orig) & selected
    random = selected & ~to_mask & ~unchanged
    # A random draw can equal the original token (p=1/995) and count as unchanged: negligible here.
    assert abs(to_mask.sum() / n - 0.80) < 0.02
    assert abs(random.sum() / n - 0.10) < 0.02
    assert abs(unchanged.sum() / n - 0.10) < 0.02
    assert not np.isin(masked[random], SPEC.special_ids).any(), "random replacements never draw special tokens"


@pytest.mark.quick
def test_random_replacements_avoid_specials_at_the_end_of_the_vocabulary():
    """Specials at the END (ids 995..999, [MASK] last), as some tokenizers order them: the 10% random
    draws never produce one of them, yet still cover the whole rest of the vocabulary, id 0 included."""
    specials = (995, 996, 997, 998, 999)
    spec = MaskSpec(mask_prob=0.5, mask_id=999, vocab_size=1000, special_ids=specials)
    ids = tf.constant(np.random.default_rng(3).integers(0, 995, size=(512, 128)), tf.int32)
    draws = spec.random_ids(tf.constant([512, 128]), tf.constant([5, 6], tf.int64), tf.int32).numpy()
    assert not np.isin(draws, specials).any()
    assert draws.min() == 0 and draws.max() == 994 and len(np.unique(draws)) == 995
    masked, labels = (t.numpy() for t in mask_tokens(ids, tf.constant([1, 2], tf.int64), spec))
    orig = ids.numpy()
    random = (labels != IGNORE) & (masked != spec.mask_id) & (masked != orig)
    assert random.sum() > 1000  # ~10% of the selected positions
    assert not np.isin(masked[random], specials).any(), "a random replacement drew a special token"


@pytest.mark.quick
def test_random_replacements_skip_specials_scattered_through_the_vocabulary():
    spec = MaskSpec(mask_prob=0.15, mask_id=7, vocab_size=12, special_ids=(0, 3, 7, 11))
    draws = spec.random_ids(tf.constant([4096]), tf.constant([9, 9], tf.int64), tf.int32).numpy()
    assert sorted(np.unique(draws)) == [1, 2, 4, 5, 6, 8, 9, 10]


@pytest.mark.quick
def test_same_seed_same_masks_other_seed_other_masks():
    ids = _batch(shape=(8, 64))
    a = mask_tokens(ids, tf.constant([5, 9], tf.int64), SPEC)[0].numpy()
    b = mask_tokens(ids, tf.constant([5, 9], tf.int64), SPEC)[0].numpy()
    c = mask_tokens(ids, tf.constant([5, 10], tf.int64), SPEC)[0].numpy()
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()


def test_masking_keeps_static_shapes_under_xla():
    fn = tf.function(lambda x, s: mask_tokens(x, s, SPEC), jit_compile=True)
    masked, labels = fn(_batch(shape=(4, 32)), tf.constant([0, 1], tf.int64))
    assert masked.shape == (4, 32) and labels.shape == (4, 32)
    concrete = tf.function(lambda x, s: mask_tokens(x, s, SPEC)).get_concrete_function(
        tf.TensorSpec([4, 32], tf.int32), tf.TensorSpec([2], tf.int64))
    assert all(o.shape.is_fully_defined() for o in concrete.outputs)


@pytest.mark.quick
def test_mlm_targets_gather_every_masked_position_with_static_shape():
    from tpu_ray.train.inputs import mlm_targets, predictions_per_sequence

    ids = tf.random.stateless_uniform([256, 128], [3, 4], minval=5, maxval=1000, dtype=tf.int32)
    _, labels = mask_tokens(ids, tf.constant([5, 6], tf.int64), SPEC)
    k = predictions_per_sequence(128, 0.15)
    assert 19 < k < 128
    positions, mlm_labels = tf.function(lambda x: mlm_targets(x, k), jit_compile=True)(labels)
    assert positions.shape == (256, k) and mlm_labels.shape == (256, k)
    lab, pos, got = labels.numpy(), positions.numpy(), mlm_labels.numpy()
    for row in range(256):
        masked = np.flatnonzero(lab[row] != IGNORE)
        n = len(masked)
        assert n <= k
        assert pos[row, :n].tolist() == masked.tolist()  # every masked position, in order
        assert got[row, :n].tolist() == lab[row, masked].tolist()
        assert (got[row, n:] == IGNORE).all()  # the rest are padding slots that the loss ignores


@pytest.mark.quick
def test_unk_is_an_ordinary_masking_target_and_other_specials_never_are():
    """16: <unk> (3.3% of WikiText tokens) is masked and predicted like any token, as the reference's
    collator does; [CLS] <pad> [SEP] [MASK] never are. The trainer's spec says so."""
    from tpu_ray.prepare.tokenizer import TokenizerInfo
    from tpu_ray.train.loop import mask_spec
    from tpu_ray.config import RunConfig

    tok = TokenizerInfo(sha256="", vocab_size=1000, cls_id=0, pad_id=1, sep_id=2, unk_id=3, mask_id=4)
    spec = mask_spec(RunConfig().train, RunConfig().paths, tok)
    assert spec.target_ids == (3,) and spec.never_masked == (0, 1, 2, 4)
    ids = _batch(shape=(2048, 128))
    masked, labels = (t.numpy() for t in mask_tokens(ids, tf.constant([3, 4], tf.int64), spec))
    orig = ids.numpy()
    unk_selected = (labels == 3) & (orig == 3)
    assert abs(unk_selected.sum() / (orig == 3).sum() - 0.15) < 0.03  # unk: selected at the usual rate
    assert not ((labels != IGNORE) & np.isin(orig, (0, 1, 2, 4))).any()
    assert (masked >= 0).all()
    # Selected <unk>s get the same 80/10/10 treatment as any token (this could fail: an unk left as
    # unk 100% of the time, or replaced by a special, would). Many unks, for the statistics.
    many = _batch(seed=1, shape=(1024, 128)).numpy()
    many[:, 10:40] = 3
    masked, labels = (t.numpy() for t in mask_tokens(tf.constant(many), tf.constant([5, 6], tf.int64), spec))
    chosen = (labels == 3) & (many == 3)
    n = chosen.sum()
    assert n > 3000
    became_mask = (masked[chosen] == spec.mask_id).sum() / n
    stayed_unk = (masked[chosen] == 3).sum() / n
    became_other = masked[chosen][(masked[chosen] != spec.mask_id) & (masked[chosen] != 3)]
    assert abs(became_mask - 0.80) < 0.03 and abs(stayed_unk - 0.10) < 0.03, (became_mask, stayed_unk)
    assert abs(len(became_other) / n - 0.10) < 0.03 and not np.isin(became_other, (0, 1, 2, 3, 4)).any()


@pytest.mark.quick
def test_exact_count_masks_round_p_times_the_maskable_tokens_of_each_row():
    """train.mask_count=exact: every row masks round(p x its maskable tokens), at least one, none
    special, within the head's static bound; 80/10/10 of them; the same seed, the same masks."""
    from tpu_ray.train.inputs import predictions_per_sequence

    spec = MaskSpec(mask_prob=0.3, mask_id=4, vocab_size=1000, special_ids=(0, 1, 2, 3, 4), exact_count=True)
    ids = _batch(shape=(512, 32)).numpy()
    ids[:5, 10:] = 1  # short rows (mostly padding): fewer maskable tokens, a smaller count
    ids[5, 1:-1] = 1  # a row with nothing maskable: nothing selected
    ids = tf.constant(ids)
    masked, labels = (t.numpy() for t in mask_tokens(ids, tf.constant([3, 4], tf.int64), spec))
    orig = ids.numpy()
    maskable = ~np.isin(orig, spec.special_ids)
    selected = labels != IGNORE
    want = np.where(maskable.sum(1) > 0, np.maximum(np.floor(maskable.sum(1) * 0.3 + 0.5), 1), 0)
    np.testing.assert_array_equal(selected.sum(1), want)
    assert not (selected & ~maskable).any()
    assert selected.sum(1).max() <= predictions_per_sequence(32, 0.3, exact_count=True) == 10
    to_mask = (masked == spec.mask_id) & selected
    assert abs(to_mask.sum() / selected.sum() - 0.8) < 0.03
    again = mask_tokens(ids, tf.constant([3, 4], tf.int64), spec)[1].numpy()
    np.testing.assert_array_equal(again, labels)
    # One trace for every batch: the count is data, not a shape.
    fn = tf.function(lambda x, s: mask_tokens(x, s, spec))
    for seed in range(3):
        fn(ids, tf.constant([seed, 0], tf.int64))
    assert fn.experimental_get_tracing_count() == 1
