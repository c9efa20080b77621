"""`tpu-ray finetune` end to end on a tiny model: two seeds fine-tuned in parallel as Ray tasks on the
built-in task, recorded as `kind: downstream` and shown by `tpu-ray metrics`. One sweep, shared by
the module's tests (slow: Ray workers import TensorFlow)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import save_tiny_roberta
from tpu_ray.cli import main

pytestmark = pytest.mark.slow
TASK = "builtin:stdlib-packages"


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer_dir) -> str:
    """A tiny RoBERTa (hidden 32, one layer, 32 positions) saved the way RUN/model is: weights + tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    return save_tiny_roberta(tok, tmp_path_factory.mktemp("tiny") / "model", max_positions=34)


@pytest.fixture(scope="module")
def sweep(tiny_model_dir, tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("ft") / "records"
    argv = ["finetune", tiny_model_dir, "--task", TASK, "--seeds", "2", "--output-dir", str(out),
            "finetune.learning_rates=[1e-3]", "finetune.epochs=1", "finetune.max_train_examples=64",
            "finetune.batch_size=16", f"finetune.export_dir={out / 'export'}", "ray.address=local"]
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    return rc, buf.getvalue(), out


def test_finetune_runs_seeds_on_ray_and_records_each_trial(sweep):
    from tpu_ray.downstream.tasks import load_task

    rc, printed, out = sweep
    assert rc == 0, printed
    assert "over 2 of 2 seeds" in printed and "over 2 seeds at lr 0.001" in printed and " ± " in printed
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if r["kind"] == "downstream"]
    task = load_task(TASK)
    n_val = len(task.splits["validation"])
    assert sorted(r["seed"] for r in records) == [0, 1]
    for r in records:
        assert r["status"] == "ok" and r["task"] == TASK and r["task_hash"] == task.digest()
        assert r["learning_rate"] == 1e-3 and r["step"] is None  # a model outside a run: no step
        assert r["train_examples"] == 64  # 64 examples x 1 epoch, as asked
        hits = r["accuracy"] * n_val  # an accuracy over the validation split is a whole count of it
        assert abs(hits - round(hits)) < 1e-6
        assert set(r) >= {"macro_f1", "matthews"}
    mean = sum(r["accuracy"] for r in records) / 2
    assert f"accuracy {mean:.4f}" in printed


def test_metrics_command_shows_downstream_records(sweep, capsys):
    _, _, out = sweep
    capsys.readouterr()
    assert main(["metrics", str(out), "--kind", "downstream"]) == 0
    table = capsys.readouterr().out
    assert table.count(TASK) == 2 and "ok" in table and "acc" in table


def test_a_fine_tuned_model_loads_in_transformers_with_its_label_names(sweep):
    from transformers import AutoTokenizer, TFAutoModelForSequenceClassification

    from tpu_ray.downstream.tasks import load_task

    _, _, out = sweep
    path = out / "export" / "lr0.001-seed1"
    model = TFAutoModelForSequenceClassification.from_pretrained(str(path), use_safetensors=False)  # tf_model.h5
    assert list(model.config.id2label.values()) == load_task(TASK).label_names
    logits = model(**AutoTokenizer.from_pretrained(str(path))(["Return the event loop."], return_tensors="tf")).logits
    assert logits.shape == (1, len(model.config.id2label))


def test_a_fine_tuned_model_loads_in_pytorch_from_safetensors_with_its_label_names(sweep):
    from tests.test_downstream_export import pytorch_logits
    from transformers import AutoTokenizer, TFAutoModelForSequenceClassification

    _, _, out = sweep
    path = out / "export" / "lr0.001-seed0"
    ids = AutoTokenizer.from_pretrained(str(path))("Return the event loop.")["input_ids"]
    tf_model = TFAutoModelForSequenceClassification.from_pretrained(str(path), use_safetensors=False)
    answer = pytorch_logits("AutoModelForSequenceClassification", path, ids)
    assert answer["id2label"] == {str(k): v for k, v in tf_model.config.id2label.items()}
    np.testing.assert_allclose(np.asarray(answer["logits"]), tf_model(np.asarray([ids])).logits.numpy()[0], atol=1e-4)
