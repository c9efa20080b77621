"""report.py: reading the metrics stream (live and finished runs), plots, report.html, text summary."""

from __future__ import annotations

import json
import math
from pathlib import Path

import fsspec
import pandas as pd
import pytest

from tpu_ray.errors import UserError
from tpu_ray.report import PLOTS, load_metrics, text_summary, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N_TRAIN, N_EVAL = 50, 3
CONFIG_YAML = "name: demo\nmodel:\n  preset: tiny\ntrain:\n  steps: 500\n  batch_size: 32  # <b>not html</b>\n"


def _records(mfu: bool = True) -> list[dict]:
    """A realistic stream: stage events, 50 train records every 10 steps, 3 evals, in time order."""
    t0 = 1_760_000_000.0
    recs: list[dict] = [
        {"kind": "event", "time": t0, "event": "stage_start", "stage": "train"},
    ]
    t = t0 + 20.0  # first step includes tracing
    for i in range(N_TRAIN):
        step = (i + 1) * 10
        step_time = 0.25 + 0.01 * math.sin(i)
        t += 10 * step_time
        loss = 2.0 + 7.0 * math.exp(-step / 120.0) + 0.05 * math.sin(i * 1.7)
        lr = 1e-3 * min(1.0, step / 50) * (1 - step / 600)
        recs.append({
            "kind": "train", "step": step, "time": t, "elapsed_s": t - t0, "loss": loss,
            "accuracy": min(0.6, 0.02 + 0.55 * (1 - math.exp(-step / 150.0))), "learning_rate": lr,
            "step_time_s": step_time, "samples_per_s": 32 / step_time, "tokens_per_s": 32 * 128 / step_time,
            "mfu": 0.31 * 0.25 / step_time if mfu else None, "train_traces": 1, "input_wait_s": 0.002,
        })
        if step in (100, 300, 500):
            t += 3.0
            el = loss + 0.15
            recs.append({"kind": "eval", "step": step, "time": t, "eval_loss": el,
                         "eval_accuracy": recs[-1]["accuracy"] - 0.02, "perplexity": math.exp(el)})
    recs.append({"kind": "event", "time": t + 1, "event": "stage_end", "stage": "train", "seconds": t + 1 - t0})
    return recs


def make_run(run_dir: Path, mfu: bool = True, partial: bool = True, summary: bool = True) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    recs = _records(mfu)
    text = "".join(json.dumps(r) + "\n" for r in recs)
    if partial:  # a live run: the writer is halfway through the next line
        text += '{"kind": "train", "step": 510, "time": 17600'
    (run_dir / "metrics.jsonl").write_text(text)
    (run_dir / "config.yaml").write_text(CONFIG_YAML)
    if summary:
        last_eval = [r for r in recs if r["kind"] == "eval"][-1]
        (run_dir / "summary.json").write_text(json.dumps({
            "strategy": "TPUStrategy", "replicas": 8, "steps": 500, "eval_loss": last_eval["eval_loss"],
            "perplexity": last_eval["perplexity"], "wall_s": 180.5}))
    return run_dir


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return make_run(tmp_path / "run")


def _check_png(path: str | Path) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 10_000, f"{path}: suspiciously small ({len(data)} bytes)"


# ------------------------------------------------------------------------------------ load_metrics

@pytest.mark.quick
def test_load_metrics_all_kinds(run_dir):
    df = load_metrics(str(run_dir))
    assert len(df) == N_TRAIN + N_EVAL + 2  # partial last line skipped
    assert df["kind"].value_counts().to_dict() == {"train": N_TRAIN, "eval": N_EVAL, "event": 2}
    for col in ("kind", "step", "time", "loss", "tokens_per_s", "mfu", "eval_loss", "perplexity", "event",
                "stage", "seconds"):
        assert col in df.columns, col
    assert df["time"].is_monotonic_increasing
    assert df.iloc[0]["event"] == "stage_start" and df.iloc[-1]["event"] == "stage_end"


@pytest.mark.quick
def test_load_metrics_train_filter(run_dir):
    df = load_metrics(str(run_dir), kind="train")
    assert len(df) == N_TRAIN
    assert set(df["kind"]) == {"train"}
    assert df["step"].tolist() == list(range(10, 501, 10))  # rising, and 510 (partial) absent
    assert df["step"].dtype == "int64"
    assert df["loss"].iloc[0] > df["loss"].iloc[-1] + 3
    assert {"loss", "accuracy", "learning_rate", "step_time_s", "samples_per_s", "tokens_per_s", "mfu",
            "train_traces", "input_wait_s", "elapsed_s"} <= set(df.columns)


@pytest.mark.quick
def test_load_metrics_eval_filter(run_dir):
    df = load_metrics(str(run_dir), kind="eval")
    assert df["step"].tolist() == [100, 300, 500]
    assert set(df["kind"]) == {"eval"}
    assert {"eval_loss", "eval_accuracy", "perplexity"} <= set(df.columns)
    assert "loss" not in df.columns


@pytest.mark.quick
def test_load_metrics_sorted_by_time_even_if_file_is_not(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    recs = [r for r in _records() if r["kind"] == "train"][:5]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reversed(recs)))
    assert load_metrics(str(run))["step"].tolist() == [10, 20, 30, 40, 50]


@pytest.mark.quick
def test_load_metrics_partial_line_is_only_skipped_at_the_end(tmp_path, caplog):
    run = tmp_path / "r"
    run.mkdir()
    good = [json.dumps(r) for r in _records() if r["kind"] == "train"][:3]
    (run / "metrics.jsonl").write_text(good[0] + "\n{garbage\n" + good[1] + "\n" + good[2] + "\n\n")
    assert load_metrics(str(run))["step"].tolist() == [10, 20, 30]
    assert "not JSON" in caplog.text  # a bad line in the middle is worth a warning


@pytest.mark.quick
def test_load_metrics_empty_run_dir(tmp_path):
    df = load_metrics(str(tmp_path))
    assert df.empty
    assert {"kind", "step", "time"} <= set(df.columns)
    (tmp_path / "metrics.jsonl").write_text("")
    df = load_metrics(str(tmp_path), kind="train")
    assert df.empty and {"kind", "step", "time", "loss"} <= set(df.columns)


@pytest.mark.quick
def test_load_metrics_missing_run_dir(tmp_path):
    """A job just submitted has no run directory yet: an empty frame with the documented columns
    and types (step an integer, time a datetime), not an error; missing_ok=False (the CLI) refuses."""
    missing = tmp_path / "no-such-run"
    df = load_metrics(str(missing))
    assert df.empty
    assert list(df.columns[:3]) == ["kind", "step", "time"]
    assert {"loss", "mfu", "eval_loss", "perplexity", "event", "stage", "seconds"} <= set(df.columns)
    assert pd.api.types.is_integer_dtype(df["step"])
    assert pd.api.types.is_datetime64_any_dtype(df["time"])
    df = load_metrics(str(missing), kind="train")
    assert df.empty and {"kind", "step", "time", "loss"} <= set(df.columns) and "eval_loss" not in df.columns
    with pytest.raises(UserError) as exc:
        load_metrics(str(missing), missing_ok=False)
    msg = str(exc.value)
    assert str(missing) in msg and "\n" not in msg


@pytest.mark.quick
def test_load_metrics_types_and_stable_columns(run_dir):
    """The same columns whether or not a kind has records yet; step an integer, time a datetime."""
    df = load_metrics(str(run_dir), kind="train")
    assert df["step"].dtype == "int64"
    assert str(df["time"].dtype) == "datetime64[ns, UTC]"
    assert list(df.columns[:3]) == ["kind", "step", "time"]
    documented = list(load_metrics(str(run_dir / "nothing-yet")).columns)  # every kind's documented columns
    assert list(load_metrics(str(run_dir)).columns[:len(documented)]) == documented


@pytest.mark.quick
def test_load_metrics_keeps_the_latest_record_of_a_repeated_step(tmp_path):
    """After --resume the steps since the last checkpoint are logged again: one row per step, the
    resumed run's."""
    run = tmp_path / "run"
    run.mkdir()
    recs = [{"kind": "train", "step": s, "time": 1000.0 + s, "loss": 5.0} for s in (25, 50, 75)]
    recs += [{"kind": "event", "event": "resume", "step": 50, "time": 1100.0}]
    recs += [{"kind": "train", "step": s, "time": 1100.0 + s, "loss": 4.0} for s in (75, 100)]
    recs += [{"kind": "eval", "step": 100, "time": 1300.0 + i, "eval_loss": 3.0 - i} for i in range(2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    train = load_metrics(str(run), kind="train")
    assert train["step"].tolist() == [25, 50, 75, 100]
    assert train.set_index("step")["loss"].to_dict() == {25: 5.0, 50: 5.0, 75: 4.0, 100: 4.0}
    assert load_metrics(str(run), kind="eval")["eval_loss"].tolist() == [2.0]
    assert len(load_metrics(str(run), kind="event")) == 1  # events are never merged


# ------------------------------------------------------------------------------------ write_report

def test_write_report(run_dir):
    paths = write_report(str(run_dir))
    assert set(paths) == {*PLOTS, "report.html"}
    for name in PLOTS:
        assert Path(paths[name]) == run_dir / name
        _check_png(paths[name])
    page = Path(paths["report.html"]).read_text()
    for name in PLOTS:
        assert f'src="{name}"' in page
    assert "final step" in page and ">500<" in page
    assert "perplexity" in page and "TPUStrategy" in page and "wall_s" in page
    assert "median tokens/s" in page and "train traces" in page
    assert "<pre>" in page and "preset: tiny" in page
    assert "&lt;b&gt;not html&lt;/b&gt;" in page  # the config is escaped, not rendered


def test_the_html_report_shows_downstream_scores_and_their_plot(tmp_path):
    """A run with downstream records: the report's Downstream table holds, per task and step, the test
    mean ± sd at the learning rate chosen on validation (counted here independently) and downstream.png
    plots them from step 0; a run without (test_write_report) gets neither."""
    import statistics

    from tests.test_downstream_history import _record, _trial
    from tpu_ray.report import DOWNSTREAM_PLOT

    run = make_run(tmp_path / "run", partial=False)
    tests_ = {0: [0.30, 0.32, 0.31], 500: [0.8, 0.9]}
    for step, values in tests_.items():
        _record(run, [_trial(s, 3e-4, 0.9, v) for s, v in enumerate(values)]
                + [_trial(s, 1e-4, 0.2, 0.99) for s in range(len(values))]
                + ([_trial(9, 3e-4, None, status="failed")] if step == 0 else []), step=step, model=f"m{step}")
    paths = write_report(str(run), str(tmp_path / "out"))
    assert set(paths) == {*PLOTS, DOWNSTREAM_PLOT, "report.html"}
    _check_png(paths[DOWNSTREAM_PLOT])
    page = Path(paths["report.html"]).read_text()
    for step, values in tests_.items():
        failed = ", 1 failed" if step == 0 else ""
        assert f"<th>builtin:stdlib-packages @ step {step}</th>" in page
        expected = f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"
        assert f"<td>test accuracy {expected} ({len(values)} seeds{failed}, lr 0.0003; validation 0.9000" in page
    assert f'src="{DOWNSTREAM_PLOT}"' in page


def test_write_report_out_dir_and_null_mfu(tmp_path):
    run = make_run(tmp_path / "run", mfu=False, partial=False, summary=False)
    (run / "config.yaml").unlink()
    out = tmp_path / "out" / "nested"
    paths = write_report(str(run), str(out))
    for name in PLOTS:
        _check_png(out / name)
    assert not (run / "loss.png").exists()
    page = Path(paths["report.html"]).read_text()
    assert "n/a" in page  # median MFU
    assert "summary.json" not in page.split("<h2>Plots</h2>")[0]


def test_write_report_empty_run(tmp_path):
    paths = write_report(str(tmp_path))
    for name in PLOTS:
        assert Path(paths[name]).read_bytes()[:8] == PNG_MAGIC
    assert "no records yet" in text_summary(str(tmp_path))


def test_write_report_remote_destination(run_dir):
    """A URL destination (memory:// stands in for gs://) is rendered locally and uploaded."""
    fs = fsspec.filesystem("memory")
    paths = write_report(str(run_dir), "memory://reports/run1")
    assert paths["loss.png"] == "memory://reports/run1/loss.png"
    with fsspec.open(paths["throughput.png"], "rb") as f:
        assert f.read(8) == PNG_MAGIC
    with fsspec.open(paths["report.html"], "rt") as f:
        assert 'src="accuracy.png"' in f.read()
    fs.rm("/reports", recursive=True)


@pytest.mark.quick
def test_remote_run_dir(run_dir):
    """Reading goes through fsspec, so a URL run directory works like a local one."""
    fs = fsspec.filesystem("memory")
    for p in run_dir.iterdir():
        fs.pipe_file(f"/runs/r1/{p.name}", p.read_bytes())
    try:
        assert len(load_metrics("memory://runs/r1", kind="train")) == N_TRAIN
        assert load_metrics("memory://runs/nope").empty
        with pytest.raises(UserError, match="memory://runs/nope"):
            load_metrics("memory://runs/nope", missing_ok=False)
    finally:
        fs.rm("/runs", recursive=True)


@pytest.mark.quick
def test_text_summary(run_dir):
    """80 columns, each number once, a user's strategy name, no row cut short."""
    text = text_summary(str(run_dir))
    lines = text.splitlines()
    assert len(lines) < 25
    assert max(len(line) for line in lines) <= 80
    for needle in ("steps", "500", "perplexity", "tokens/s", "ms/step", "step traces", "TPUStrategy",
                   "train 155.0s", "MFU"):
        assert needle in text, needle
    assert "summary." not in text and "…" not in text  # no raw summary.json dump, nothing cut
    assert text.count("perplexity") == 1
    assert "\x1b[" not in text  # plain text, no ANSI codes


@pytest.mark.quick
def test_text_summary_names_the_cpu_strategy_and_gives_no_mfu_on_cpu(tmp_path):
    run = make_run(tmp_path / "run", mfu=False)
    (run / "summary.json").write_text(json.dumps({"strategy": "_DefaultDistributionStrategy", "kind": "cpu",
                                                  "device": "cpu", "replicas": 1, "global_batch": 32}))
    text = text_summary(str(run))
    assert "_Default" not in text and "default (one device)" in text
    assert "n/a on CPU" in text


@pytest.mark.quick
def test_text_summary_stays_one_screen_with_long_summary_values(tmp_path):
    """summary.json lists every shard file read: the text summary shows counts, not the list."""
    run = make_run(tmp_path / "run")
    files = [f"gs://bucket/run/shards/train-{i:05d}-4096.tfrecord" for i in range(500)]
    summary = {"files_read": files, "shards": {"shards": 500, "samples": 10**6, "tokens": 128 * 10**6}}
    (run / "summary.json").write_text(json.dumps(summary))
    text = text_summary(str(run))
    assert len(text.splitlines()) < 25
    assert "500 files, 1,000,000 samples, 128,000,000 tokens" in text
    assert "train-00499" not in text


def test_cli_report(run_dir, capsys):
    from tpu_ray.cli import main

    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "perplexity" in out and f"report: {run_dir / 'report.html'}" in out
    page = (run_dir / "report.html").read_text()
    for name in PLOTS:
        _check_png(run_dir / name)
        assert f'src="{name}"' in page


@pytest.mark.quick
def test_cli_report_missing_run_dir(tmp_path, capsys):
    from tpu_ray.cli import main

    assert main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"tpu-ray: error: run directory not found: {tmp_path / 'nope'}"


@pytest.mark.quick
def test_metrics_writers_taking_turns_on_a_gs_run_keep_every_record(gcs_emulator):
    """The pipeline's writer, then the trainer's, then the pipeline's again, on one gs:// run: an
    upload adds to what is there, so no writer's records are lost to another's."""
    from tpu_ray.train.metrics import MetricsWriter

    run = f"{gcs_emulator.make_bucket()}/run"
    pipeline = MetricsWriter(run, tensorboard=False)
    pipeline.event("stage_start", stage="train")
    trainer = MetricsWriter(run, tensorboard=False, remote_every_s=3600)
    trainer.write("train", step=5, loss=1.0)
    trainer.write("train", step=10, loss=0.9)  # held: the upload interval has not passed
    trainer.event("train_end", stage="train")  # events upload at once
    pipeline.event("stage_end", stage="train")
    pipeline.flush()
    df = load_metrics(run)
    assert df["kind"].tolist() == ["event", "train", "train", "event", "event"]
    assert df["event"].tolist()[::3] == ["stage_start", "train_end"]
    assert df["event"].tolist()[-1] == "stage_end" and df["step"].tolist()[1:3] == [5, 10]


@pytest.mark.quick
def test_concurrent_metrics_writers_on_gs_lose_no_record(gcs_emulator):
    """Four writers uploading at the same time (threads, each with its own uploads) on one gs:// run:
    a read-modify-write of one object would drop records of overlapping uploads; every record is kept.
    A writer that dies with records held loses only those (its last interval)."""
    import threading

    from tpu_ray import storage
    from tpu_ray.train.metrics import MetricsWriter

    run = f"{gcs_emulator.make_bucket()}/run"
    start = threading.Barrier(4)

    def write(w: int) -> None:
        writer = MetricsWriter(run, tensorboard=False)
        start.wait()
        for i in range(12):
            writer.event("tick", writer=w, i=i)  # events upload at once

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    crashed = MetricsWriter(run, tensorboard=False, remote_every_s=3600)
    crashed.write("train", step=1, loss=1.0)
    crashed.event("node_lost")  # uploaded with the train record before it
    crashed.write("train", step=2, loss=0.5)  # held, never flushed: the process "dies" here
    df = load_metrics(run)
    ticks = df[df["event"] == "tick"]
    assert sorted(zip(ticks["writer"], ticks["i"])) == [(w, i) for w in range(4) for i in range(12)]
    assert df[df["kind"] == "train"]["step"].tolist() == [1]
    assert not storage.exists(f"{run}/metrics.jsonl")  # nobody rewrites a shared object


@pytest.mark.quick
def test_a_branchs_summary_says_where_it_branched(tmp_path):
    """A decay branched off a stable run at step 200 said "300 (resumed at 200)": it never ran
    steps 0-200 itself and was never resumed. Records written by the trainer's own writer."""
    import json

    from tpu_ray.metrics_stream import MetricsWriter
    from tpu_ray.report import text_summary

    def summary_of(run, resumed_at=None):
        run.mkdir()
        writer = MetricsWriter(str(run))
        writer.event("branch", stage="train", step=200, checkpoint="stable/checkpoints/ckpt-200", source="stable")
        for step in (250, 300):
            writer.write("train", step=step, loss=3.0, accuracy=0.3)
        writer.close()
        (run / "summary.json").write_text(json.dumps({"steps": 300, "resumed_from": resumed_at or 200}))
        return next(line for line in text_summary(str(run)).splitlines() if line.strip("│ ").startswith("steps "))

    line = summary_of(tmp_path / "branch")
    assert "300 (branched from step 200)" in line and "resumed" not in line, line
    line = summary_of(tmp_path / "resumed-branch", resumed_at=250)
    assert "300 (branched from step 200, resumed at 250)" in line, line


@pytest.mark.quick
def test_report_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    from tpu_ray.report import write_report
    from tpu_ray.train.metrics import MetricsWriter

    run = tmp_path / "run"
    run.mkdir()
    writer = MetricsWriter(str(run), tensorboard=False)
    for step in (1, 2):
        writer.write("train", step=step, loss=5.0 / step, lr=1e-3, samples_per_s=10.0, tokens_per_s=100.0)
    victim = tmp_path / "victim.html"
    victim.write_text("mine\n")
    (run / "report.html").symlink_to(victim)
    (run / "loss.png").symlink_to(victim)
    write_report(str(run))
    assert victim.read_text() == "mine\n"
    assert not (run / "report.html").is_symlink() and "<html" in (run / "report.html").read_text()
    assert not (run / "loss.png").is_symlink()
