"""`tpu-ray finetune` end to end on a tiny model: seeds fine-tuned in parallel as Ray tasks on a task of
integer labels (the built-in task's texts, its classes renumbered 7, 3, 11, 5 as a Hub dataset might
ship them), recorded as `kind: downstream` with every split's scores, kept on a rerun, and two models
set against each other in a verdict. One sweep, shared by the module's tests (slow: Ray workers
import TensorFlow)."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from tests.helpers import save_tiny_roberta
from tpu_ray.cli import main

pytestmark = pytest.mark.slow
LABELS = [7, 3, 11, 5]  # class i of the built-in task, as an integer label in the files
QUICK = ["finetune.learning_rates=[1e-3]", "finetune.epochs=2", "finetune.max_train_examples=64",
         "finetune.batch_size=16", "ray.address=local"]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer_dir) -> str:
    """A tiny RoBERTa (hidden 32, one layer, 32 positions) saved the way RUN/model is: weights + tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    return save_tiny_roberta(tok, tmp_path_factory.mktemp("tiny") / "model", max_positions=34)


@pytest.fixture(scope="module")
def int_task(tmp_path_factory) -> str:
    from tpu_ray.downstream.builtin import builtin_rows

    splits, _ = builtin_rows()
    d = tmp_path_factory.mktemp("task")
    for split, rows in splits.items():
        (d / f"{split}.jsonl").write_text("".join(json.dumps({"text": r["text"], "label": LABELS[r["label"]]}) + "\n"
                                                  for r in rows))
    return str(d)


def _finetune(*argv) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["finetune", *argv])
    return rc, buf.getvalue()


@pytest.fixture(scope="module")
def sweep(tiny_model_dir, int_task, tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("ft") / "records"
    rc, printed = _finetune(tiny_model_dir, "--task", int_task, "--seeds", "2", "--output-dir", str(out),
                            f"finetune.export_dir={out / 'export'}", *QUICK)
    return rc, printed, out


def _records(out) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "downstream"]


def test_finetune_runs_seeds_on_ray_and_records_each_trial(sweep, int_task):
    from tpu_ray.downstream.tasks import load_task

    rc, printed, out = sweep
    assert rc == 0, printed
    assert "over 2 of 2 seeds" in printed and "test accuracy" in printed and "held out" in printed
    records = _records(out)
    task = load_task(int_task)
    assert task.label_names == ["3", "5", "7", "11"]  # classes by value, sorted
    assert sorted(r["seed"] for r in records) == [0, 1]
    for r in records:
        assert r["status"] == "ok" and r["task_hash"] == task.digest() and r["report_split"] == "test"
        assert r["learning_rate"] == 1e-3 and r["step"] is None  # a model outside a run: no step
        assert r["train_examples"] == 128  # 64 examples x 2 epochs, as asked
        assert (r["epochs"], r["max_train_examples"], r["batch_size"], r["max_length"]) == (2, 64, 16, 128)
        assert r["max_length_used"] == 32 and r["best_epoch"] in (1, 2)  # capped by the 34 positions
        for split, n in (("", len(task.splits["validation"])), ("test_", len(task.splits["test"]))):
            hits = r[f"{split}accuracy"] * n  # an accuracy over a split is a whole count of it
            assert abs(hits - round(hits)) < 1e-6
    mean = sum(r["test_accuracy"] for r in records) / 2
    assert f"test accuracy: {mean:.4f}" in printed


def test_the_recorded_scores_are_a_hand_count_of_the_exported_models_predictions(sweep, int_task):
    """The export of seed 1 is its best epoch's model: its predictions on test, read through its
    id2label and compared by value with the file's integer labels, count to the recorded test accuracy."""
    from transformers import AutoTokenizer, TFAutoModelForSequenceClassification

    _, _, out = sweep
    path = out / "export" / "lr0.001-seed1"
    model = TFAutoModelForSequenceClassification.from_pretrained(str(path), use_safetensors=False)
    tok = AutoTokenizer.from_pretrained(str(path))
    rows = [json.loads(line) for line in open(f"{int_task}/test.jsonl")]
    enc = tok([r["text"] for r in rows], truncation=True, max_length=32, padding=True, return_tensors="tf")
    predicted = [int(model.config.id2label[int(i)]) for i in model(**enc).logits.numpy().argmax(-1)]
    hand = sum(p == r["label"] for p, r in zip(predicted, rows)) / len(rows)
    (rec,) = [r for r in _records(out) if r["seed"] == 1]
    assert rec["test_accuracy"] == pytest.approx(hand)


def test_a_sweep_run_again_keeps_its_recorded_trials_and_counts_them_once(sweep, tiny_model_dir, int_task):
    _, _, out = sweep
    before = _records(out)
    rc, printed = _finetune(tiny_model_dir, "--task", int_task, "--seeds", "2", "--output-dir", str(out), *QUICK)
    assert rc == 0, printed
    assert _records(out) == before  # nothing run again, nothing appended
    mean = sum(r["test_accuracy"] for r in before) / 2
    assert f"test accuracy: {mean:.4f} ± " in printed and "over 2 seeds" in printed


def test_a_sweep_run_again_with_an_export_dir_runs_its_trials_to_export_them(sweep, tiny_model_dir, int_task):
    _, _, out = sweep
    dead = out / "export-again" / ".lr0.001-seed0.partial-0dead0"  # a worker that died mid-export left it
    dead.mkdir(parents=True)
    (dead / "tf_model.h5").write_bytes(b"half")
    rc, printed = _finetune(tiny_model_dir, "--task", int_task, "--seeds", "1", "--output-dir", str(out),
                            f"finetune.export_dir={out / 'export-again'}", *QUICK)
    assert rc == 0, printed
    assert (out / "export-again" / "lr0.001-seed0" / "config.json").is_file()  # run, not kept from the records
    assert sorted(p.name for p in (out / "export-again").iterdir()) == ["lr0.001-seed0"]  # nothing half-written


def test_a_trial_no_node_can_hold_is_refused_before_anything_runs(sweep, tiny_model_dir, int_task, capsys):
    _, _, out = sweep
    rc = main(["finetune", tiny_model_dir, "--task", int_task, "--output-dir", str(out / "big"),
               "finetune.cpus_per_trial=64", *QUICK])
    err = capsys.readouterr().err
    assert rc == 2 and "finetune.cpus_per_trial=64" in err and "no node of this Ray cluster" in err, err
    assert not (out / "big" / "metrics.jsonl").exists()


def test_two_models_fine_tuned_together_get_a_paired_verdict(sweep, tiny_model_dir, int_task, tmp_path):
    """Two models (the second another random start): each swept, its records in a directory of its
    own; the verdict pairs their seeds, and its figure is the difference counted here."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from tpu_ray.downstream.verdict import paired

    other = save_tiny_roberta(AutoTokenizer.from_pretrained(tiny_model_dir), tmp_path / "other", max_positions=34)
    rc, printed = _finetune(tiny_model_dir, other, "--task", int_task, "--seeds", "2", "--output-dir",
                            str(tmp_path / "both"), *QUICK)
    assert rc == 0, printed
    assert "did pretraining help?" in printed
    first_label = Path(tiny_model_dir).parent.name  # RUN/model or DIR/model: named by the directory above
    first = {r["seed"]: r["test_accuracy"] for r in _records(tmp_path / "both" / first_label)}
    second = {r["seed"]: r["test_accuracy"] for r in _records(tmp_path / "both" / "other")}
    assert sorted(first) == sorted(second) == [0, 1]
    # the verdict's arithmetic is tested on its own (test_downstream_verdict.py); here: it is given the
    # two models' recorded test scores, paired by seed, with the first model as the baseline
    expected = paired(first_label, first, "other", second, "accuracy", "test").words()
    assert f"  {expected}" in printed.splitlines(), printed


def test_metrics_command_shows_downstream_records(sweep, capsys):
    _, _, out = sweep
    capsys.readouterr()
    assert main(["metrics", str(out), "--kind", "downstream"]) == 0
    table = capsys.readouterr().out
    assert table.count("ok") >= 2 and "acc" in table


def test_a_fine_tuned_model_loads_in_pytorch_from_safetensors_with_its_label_names(sweep):
    from tests.test_downstream_export import pytorch_logits
    from transformers import AutoTokenizer, TFAutoModelForSequenceClassification

    _, _, out = sweep
    path = out / "export" / "lr0.001-seed0"
    ids = AutoTokenizer.from_pretrained(str(path))("Return the event loop.")["input_ids"]
    tf_model = TFAutoModelForSequenceClassification.from_pretrained(str(path), use_safetensors=False)
    assert list(tf_model.config.id2label.values()) == ["3", "5", "7", "11"]
    answer = pytorch_logits("AutoModelForSequenceClassification", path, ids)
    assert answer["id2label"] == {str(k): v for k, v in tf_model.config.id2label.items()}
    np.testing.assert_allclose(np.asarray(answer["logits"]), tf_model(np.asarray([ids])).logits.numpy()[0], atol=1e-4)


@pytest.mark.parametrize("task, headline", [("cola", "matthews"), ("mrpc", "f1"), ("stsb", "pearson"),
                                            ("mnli", "accuracy")])
def test_glue_tasks_in_glues_own_layout_fine_tune_with_their_official_metric_first(
        sweep, tiny_model_dir, tmp_path, task, headline):
    """GLUE's own files (headerless CoLA, MRPC's `#1 String` columns, STS-B's scores, MNLI's matched and
    mismatched dev files; test_downstream_glue.py writes them as GLUE ships them) fine-tune through the
    command line; each record's headline is GLUE's official metric, MNLI's mismatched dev scored beside."""
    from tests.test_downstream_glue import _write_task

    data = _write_task(tmp_path, task)
    (tmp_path / "task.yaml").write_text(f"glue: {task}\ndata: {data}\n")
    rc, printed = _finetune(tiny_model_dir, "--task", str(tmp_path / "task.yaml"), "--seeds", "1",
                            "--output-dir", str(tmp_path / "out"), "finetune.learning_rates=[1e-3]",
                            "finetune.epochs=1", "finetune.batch_size=4", "ray.address=local")
    assert rc == 0, printed
    (rec,) = _records(tmp_path / "out")
    assert rec["task"] == f"glue/{task}" and rec["metric"] == headline and rec["report_split"] == "validation"
    assert f"glue/{task} validation {headline}:" in printed
    if task == "mnli":
        assert 0 <= rec["validation_mismatched_accuracy"] <= 1
