"""A phase continues where the text read so far ends. At one length the next phase
reads the next samples of the same order (no sample twice while unread samples remain); at
another length it starts at the first unit not yet read; `text_read` is checked against a count
of the records actually read; a resume inside phase 2 reads what the uninterrupted stream reads;
each phase's FLOPs per token are kept by its index."""

from __future__ import annotations

import pytest
import tensorflow as tf

from tests.test_phases import _shard
from tpu_ray.prepare.shard_set import ShardSet


def _plan(cfg):
    """The run's spans, shard sets per length and the phases' data plan, as the loop builds them."""
    from tpu_ray.train.span_data import phase_data
    from tpu_ray.train.phases import spans

    all_spans = spans(cfg.train, cfg.shard.seq_len)
    sets = {sp.seq_len: ShardSet.open(cfg.paths.shards_at(sp.seq_len)) for sp in all_spans}
    return all_spans, sets, phase_data(all_spans, sets, None, cfg.seed, cfg.train.shuffle_buffer)


def _phase_records(cfg, all_spans, sets, data, index: int, local_start: int = 0) -> list[bytes]:
    """The serialized records phase `index` reads (one pipeline), from its sample `local_start` on:
    the stream the loop's input builds (train_dataset's seekable_records, the same arguments)."""
    from tpu_ray.train.input_position import seekable_records

    span = all_spans[index]
    files = sets[span.seq_len].files("train")
    start = data.start(index, "corpus")
    excluded = data.excluded(index, "corpus", start)
    ds = seekable_records([f for f, _ in files], [n for _, n in files], cfg.seed, cfg.train.shuffle_buffer,
                          start_sample=start.offset + local_start, first_epoch=start.epoch,
                          excluded=[excluded.get(f, []) for f, _ in files] if excluded else None)
    return [r.numpy() for r in ds.take(span.steps * span.batch_size - local_start)]


def _owners(shards: ShardSet) -> dict[bytes, tuple[str, float]]:
    """Each train record's file and that file's bytes per record, by reading every file (the count
    text_read is checked against, independent of the plan's arithmetic)."""
    return {r: (path, nbytes) for r, (path, nbytes, _) in _texts(shards).items()}


def _texts(shards: ShardSet) -> dict[bytes, tuple[str, float, tuple]]:
    """Each train record's file, bytes, and the text it holds: (file's unit and part from its name,
    first token, end token) in the tokens the shard stage cut every length from (row i of a
    length L file holds tokens [i (L-2), (i+1) (L-2)))."""
    import re

    body = shards.seq_len - 2
    out = {}
    for e in shards.split_entries("train"):
        m = re.search(r"-(\d+)(?:\.(\d+))?-\d+\.tfrecord$", e.path)
        piece = (int(m.group(1)), int(m.group(2) or -1))
        for i, r in enumerate(tf.data.TFRecordDataset(f"{shards.directory}/{e.path}")):
            out[r.numpy()] = (e.path, e.bytes / e.samples, (piece, i * body, (i + 1) * body))
    return out


def _overlaps(texts: list[tuple], read: list[tuple]) -> int:
    """How many of `texts` share any token with `read` (both lists of (piece, lo, hi))."""
    by_piece: dict = {}
    for piece, lo, hi in read:
        by_piece.setdefault(piece, []).append((lo, hi))
    return sum(any(lo < b and a < hi for a, b in by_piece.get(piece, ())) for piece, lo, hi in texts)


def test_two_phases_at_one_length_read_no_sample_twice_while_unread_ones_remain(tmp_path, small_corpus,
                                                                                  tiny_tokenizer_dir):
    cfg = _shard(tmp_path / "run", small_corpus, tiny_tokenizer_dir, **{
        "train.phases": [{"steps": 30, "seq_len": 64, "batch_size": 16}, {"steps": 50, "seq_len": 64,
                                                                           "batch_size": 32}]})
    all_spans, sets, data = _plan(cfg)
    n = sets[64].samples("train")
    first = _phase_records(cfg, all_spans, sets, data, 0)
    second = _phase_records(cfg, all_spans, sets, data, 1)
    assert len(first) + len(second) > n  # the corpus wraps inside phase 2
    both = first + second
    assert len(set(both[:n])) == n  # every sample once before any twice
    assert data.start(1, "corpus").offset == 30 * 16 and data.start(1, "corpus").epoch == 0
    # The next samples of the same order: phase 2 is the uninterrupted stream's continuation.
    from tpu_ray.train.input_position import seekable_records

    files = sets[64].files("train")
    whole = [r.numpy() for r in seekable_records([f for f, _ in files], [c for _, c in files], cfg.seed,
                                                 cfg.train.shuffle_buffer).take(len(both))]
    assert both == whole
    shares = data.text_read()
    owners = _owners(sets[64])
    total = sum(e.bytes for e in sets[64].split_entries("train"))
    assert shares[0] == 0.0
    assert shares[1] == pytest.approx(sum(owners[r][1] for r in set(first)) / total, rel=1e-9)
    # A resume inside phase 2 (its sample 100) reads what the uninterrupted phase reads from there.
    assert _phase_records(cfg, all_spans, sets, data, 1, local_start=100) == second[100:]


def test_a_phase_at_another_length_starts_with_text_the_first_did_not_read(tmp_path, small_corpus,
                                                                             tiny_tokenizer_dir):
    cfg = _shard(tmp_path / "run", small_corpus, tiny_tokenizer_dir, **{
        "train.phases": [{"steps": 40, "seq_len": 32, "batch_size": 16}, {"steps": 30, "seq_len": 64,
                                                                           "batch_size": 8},
                         {"steps": 20, "seq_len": 32, "batch_size": 16}]})
    all_spans, sets, data = _plan(cfg)
    short, long = _owners(sets[32]), _owners(sets[64])
    text = {**_texts(sets[32]), **_texts(sets[64])}
    phases = [_phase_records(cfg, all_spans, sets, data, k) for k in range(3)]
    owners = [short, long, short]
    read = [[text[r][2] for r in phases[k]] for k in range(3)]
    assert _overlaps(read[1], read[0]) == 0  # phase 2 (64) reads no text phase 1 (32) read
    assert _overlaps(read[2], read[0] + read[1]) == 0  # nor phase 3 (32 again) that of phases 1 and 2
    # ... though phase 1 touched most units: the rest of each is read, not skipped (issue: units marked whole)
    unit_of = {e.path: e.unit for s in sets.values() for e in s.split_entries("train")}
    assert {unit_of[owners[0][r][0]] for r in phases[0]} & {unit_of[owners[1][r][0]] for r in phases[1]}
    assert len(set(phases[0])) == len(phases[0]) and len(set(phases[2])) == len(phases[2])
    # text_read: the bytes of the distinct records read, each phase over its own length's train bytes.
    totals = {length: sum(e.bytes for e in s.split_entries("train")) for length, s in sets.items()}
    counted = [sum(owners[k][r][1] for r in set(phases[k])) / totals[all_spans[k].seq_len] for k in range(2)]
    shares = data.text_read()
    assert shares == pytest.approx([0.0, counted[0], counted[0] + counted[1]], rel=1e-9)
    assert 0 < shares[1] < shares[2] < 1
    # A resume inside phase 2 reads what the uninterrupted phase reads from there.
    assert _phase_records(cfg, all_spans, sets, data, 1, local_start=37) == phases[1][37:]


@pytest.mark.quick
def test_each_phase_keeps_its_own_flops_per_token_by_its_index(tiny_tokenizer_dir, tmp_path):
    from tests.helpers import tiny_config
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.loop_hooks import PhaseFlops
    from tpu_ray.train.model import hf_config, train_flops_per_token
    from tpu_ray.train.phases import spans

    cfg = tiny_config(tmp_path, tmp_path, **{"tokenizer.path": tiny_tokenizer_dir, "train.phases": [
        {"steps": 2, "seq_len": 32}, {"steps": 2, "seq_len": 64}, {"steps": 2, "seq_len": 16}]})
    tok = tokenizer_info(tiny_tokenizer_dir)
    model_config = hf_config(cfg.model_spec, tok)
    flops = PhaseFlops(cfg.model, cfg.train, cfg.shard.seq_len, tok.vocab_size, model_config)
    seen = [(flops.of(span), train_flops_per_token(cfg.model, cfg.train, cfg.shard.seq_len, tok.vocab_size,
                                                   model_config, span)) for span in spans(cfg.train, cfg.shard.seq_len)]
    assert [f for f, _ in seen] == [want for _, want in seen]
    assert len({f for f, _ in seen}) == 3  # three lengths, three figures
    from dataclasses import replace

    assert flops.of(replace(spans(cfg.train, cfg.shard.seq_len)[1], index=0)) == seen[0][0]  # kept by the index


def test_each_source_of_a_mixture_continues_where_its_text_read_ends(tmp_path, small_corpus, tiny_tokenizer_dir):
    from tests.test_phases import _shard_sources
    from tpu_ray.train.span_data import phase_data, phase_tracker
    from tpu_ray.train.mixture import mixture_of
    from tpu_ray.train.phases import spans

    lines = small_corpus.read_text().splitlines(keepends=True)
    (tmp_path / "a.txt").write_text("".join(lines[: len(lines) // 2]))
    (tmp_path / "b.txt").write_text("".join(lines[len(lines) // 2:]))
    sources = {"a": {"source": str(tmp_path / "a.txt"), "weight": 3}, "b": {"source": str(tmp_path / "b.txt")}}
    cfg = _shard_sources(tmp_path / "run", sources, tiny_tokenizer_dir, **{
        "train.phases": [{"steps": 8, "seq_len": 16, "batch_size": 128}, {"steps": 4, "seq_len": 32,
                                                                            "batch_size": 128}]})
    all_spans = spans(cfg.train, cfg.shard.seq_len)
    sets = {sp.seq_len: ShardSet.open(cfg.paths.shards_at(sp.seq_len)) for sp in all_spans}
    mixture = mixture_of(cfg.corpus, cfg.seed, sets[32])
    data = phase_data(all_spans, sets, mixture, cfg.seed, cfg.train.shuffle_buffer)  # what the loop builds, and its trackers
    trackers = [phase_tracker(sp, sets[sp.seq_len], mixture, cfg.seed, cfg.train.shuffle_buffer) for sp in all_spans]
    ctx = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)
    text = {r: t for s in sets.values() for r, (_, _, t) in _texts(s).items()}
    read = []
    for k, (span, tracker) in enumerate(zip(all_spans, trackers)):
        tracker.phase_data, tracker.phase = data, k
        records, _ = tracker.records(ctx, 0)
        read.append([text[r.numpy()] for r in records.take(span.steps * span.batch_size)])
    assert _overlaps(read[1], read[0]) == 0  # no text phase 1 read (of either source) is read again in phase 2
    tokens = data.start(1, "a").read.tokens() + data.start(1, "b").read.tokens()
    assert tokens == sum(hi - lo for _, lo, hi in read[0])  # what phase 1 read (no row twice), exactly
    shares = data.text_read()
    assert shares[0] == 0.0 and 0 < shares[1] < 1


def test_a_later_phase_checkpoint_from_before_the_fix_is_another_data_order(tmp_path, small_corpus,
                                                                             tiny_tokenizer_dir):
    from dataclasses import replace

    from tpu_ray.errors import UserError
    from tpu_ray.train.span_data import phase_tracker
    from tpu_ray.train.phases import PhasePositions

    cfg = _shard(tmp_path / "run", small_corpus, tiny_tokenizer_dir, **{
        "train.phases": [{"steps": 6, "seq_len": 32}, {"steps": 4, "seq_len": 64, "batch_size": 8}]})
    all_spans, sets, data = _plan(cfg)
    trackers = [phase_tracker(sp, sets[sp.seq_len], None, cfg.seed, cfg.train.shuffle_buffer) for sp in all_spans]
    for k, t in enumerate(trackers):
        t.phase_data, t.phase = data, k
    positions = PhasePositions(all_spans, trackers)
    now = positions.at(8)
    assert now.stream == data.start(1, "corpus").describe() and now.stream["read_units"] >= 1
    assert positions.check_resume(now.to_json(), 8, "ckpt-8") == now
    old = replace(now, stream=None).to_json()  # what the code before the fix stored: no stream
    with pytest.raises(UserError, match="phase 1's stream starting elsewhere .*train.accept_new_data_order"):
        positions.check_resume(old, 8, "ckpt-8")
    assert positions.check_resume(old, 8, "ckpt-8", accept_new_order=True) == now
    first = positions.at(4)  # phase 1 reads what it read before: its old positions resume as they were
    assert positions.check_resume(replace(first, stream=None).to_json(), 4, "ckpt-4").samples == 4 * 16


@pytest.mark.slow  # three compiles and two short trainings: over the 20 s budget on 2 cores
def test_a_two_phase_run_at_one_length_trains_on_what_the_run_without_phases_trains_on(tmp_path, small_corpus,
                                                                                        tiny_tokenizer_dir):
    """The loop's own input: phase 2 continues phase 1's order, and the masks follow the global
    batch index, so two phases at one length and batch are the run without phases, loss for loss
    (phase 2 once read phase 1's samples again)."""
    from tests.test_phases import _records
    from tpu_ray.train.loop import train

    cfg = _shard(tmp_path / "run", small_corpus, tiny_tokenizer_dir, **{
        "train.phases": [{"steps": 2, "seq_len": 64}, {"steps": 2, "seq_len": 64}]})
    over = {"shard.dir": cfg.shards_dir, "train.log_every": 1, "train.eval_every": 100,
            "train.checkpoint_every": 100, "train.placement": "local", "model.dropout": 0.0}
    train(cfg.override({**over, "output_dir": str(tmp_path / "phased")}))
    train(cfg.override({**over, "output_dir": str(tmp_path / "plain"), "train.phases": None, "train.steps": 4}))
    phased = {r["step"]: r["loss"] for r in _records(tmp_path / "phased", "train")}
    plain = {r["step"]: r["loss"] for r in _records(tmp_path / "plain", "train")}
    assert sorted(phased) == sorted(plain) == [1, 2, 3, 4]
    for step in plain:
        assert phased[step] == pytest.approx(plain[step], rel=1e-5), step


@pytest.mark.parametrize("kind", ["jsonl.gz", "csv"])
def test_a_phase_at_another_length_reads_no_text_of_a_streamed_corpus_twice(kind, tmp_path, small_corpus,
                                                                            tiny_tokenizer_dir):
    """A compressed JSON-lines file or a CSV is one work unit over many part files (one unit id): the
    phase after a first one at another length reads only text the first did not, and text_read is
    the bytes of the records the first read, counted from the records its stream gave."""
    import csv
    import gzip
    import json

    from tpu_ray.train.phases import spans
    from tpu_ray.train.span_data import phase_tracker

    lines = [line for line in small_corpus.read_text().splitlines() if line.strip()]
    corpus = tmp_path / f"corpus.{kind}"
    if kind == "csv":
        with open(corpus, "w", newline="") as f:
            csv.writer(f).writerows([["id", "text"]] + [[i, line] for i, line in enumerate(lines)])
    else:
        corpus.write_bytes(gzip.compress("".join(json.dumps({"text": line}) + "\n" for line in lines).encode()))
    cfg = _shard(tmp_path / "run", corpus, tiny_tokenizer_dir, **{"shard.unit_bytes": 16384, "train.phases": [
        {"steps": 12, "seq_len": 32, "batch_size": 32}, {"steps": 12, "seq_len": 64, "batch_size": 32}]})
    all_spans, sets, data = _plan(cfg)
    entries = sets[64].split_entries("train")
    assert len({e.unit for e in entries}) == 1 and len(entries) > 10  # one unit, many parts
    trackers = [phase_tracker(sp, sets[sp.seq_len], None, cfg.seed, cfg.train.shuffle_buffer) for sp in spans(cfg.train, cfg.shard.seq_len)]
    ctx = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)
    texts = {**_texts(sets[32]), **_texts(sets[64])}
    records = []
    for k, (span, tracker) in enumerate(zip(all_spans, trackers)):
        tracker.phase_data, tracker.phase = data, k  # as span_data sets them: what the loop's input reads
        got, _ = tracker.records(ctx, 0)
        records.append([r.numpy() for r in got.take(span.steps * span.batch_size)])
    first, second = ([texts[r][2] for r in rs] for rs in records)
    unread_rows = sets[64].samples("train") - _overlaps([t for _, _, t in _texts(sets[64]).values()], first)
    assert unread_rows >= len(second)  # unread text remains for the whole second phase ...
    assert _overlaps(second, first) == 0  # ... and it reads none of what the first read
    assert len(set(records[1])) == len(records[1])
    total = sum(e.bytes for e in sets[32].split_entries("train"))
    counted = sum(texts[r][1] for r in set(records[0])) / total  # bytes of the distinct records read
    assert data.text_read() == pytest.approx([0.0, counted], rel=1e-9)
