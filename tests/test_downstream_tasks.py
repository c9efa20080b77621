"""Downstream tasks and metrics (quick: no training, no Ray): the built-in task, tasks from files and
GLUE-shaped data, every refusal of a bad task (one line, exit 2, before anything runs), and the
metrics against independent counts."""

from __future__ import annotations

import json
import math

import pytest

from tpu_ray.cli import main
from tpu_ray.downstream.metrics import score
from tpu_ray.downstream.sweep import Summary, Trial
from tpu_ray.downstream.tasks import load_task

pytestmark = pytest.mark.quick


def _write(path, rows, sep=","):
    keys = list(rows[0])
    lines = [sep.join(keys)] + [sep.join(str(r[k]) for k in keys) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def _rows(labels, pair=False):
    out = []
    for i, label in enumerate(labels):
        r = {"text": f"sentence number {i} about {label}", "label": label}
        if pair:
            r["text_pair"] = f"the pair of {i}"
        out.append(r)
    return out


def test_builtin_task_is_balanced_deterministic_and_labelled_by_package():
    from tpu_ray.downstream.builtin import CLASSES, builtin_rows
    from tpu_ray.downstream.tasks import builtin_task

    task = load_task("builtin:stdlib-packages")
    again = builtin_task(builtin_rows.__wrapped__())  # built a second time, not from the cache
    assert again.digest() == task.digest()
    assert len(task.label_names) == CLASSES
    per_class = {name: 0 for name in task.label_names}
    texts = []
    for rows in task.splits.values():
        for r in rows:
            per_class[task.label_names[r["label"]]] += 1
            texts.append(r["text"])
    assert len(set(per_class.values())) == 1  # balanced: every class cut to the smallest one's count
    assert len(texts) == len(set(texts))  # no text in two splits or under two labels
    # Each label is the package that defines the text: find it among that package's own docstrings.
    import importlib
    import inspect
    import pkgutil

    r = task.splits["validation"][0]
    package = task.label_names[r["label"]]
    spec = importlib.util.find_spec(package)
    found = False
    for info in [None, *pkgutil.walk_packages(spec.submodule_search_locations, package + ".")]:
        name = package if info is None else info.name
        if "__main__" in name:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:  # a Windows-only module
            continue
        for obj in vars(module).values():
            members = [obj, *vars(obj).values()] if inspect.isclass(obj) else [obj]
            for m in members:
                doc = getattr(m, "__doc__", None)
                if isinstance(doc, str) and " ".join(inspect.cleandoc(doc).split("\n\n")[0].split()) == r["text"]:
                    found = True
    assert found, (package, r["text"])
    assert task.chance() < 0.35


def test_builtin_task_ignores_methods_other_libraries_patch_into_the_stdlib():
    """transformers sets `logging.Logger.warning_advice`: importing it must not change the task."""
    import logging

    from tpu_ray.downstream.builtin import builtin_rows
    from tpu_ray.downstream.tasks import builtin_task

    before = builtin_task(builtin_rows.__wrapped__()).digest()

    def warning_advice(self, *args):
        """A method a third-party library adds to the logging module's Logger class."""

    logging.Logger.warning_advice = warning_advice
    try:
        assert builtin_task(builtin_rows.__wrapped__()).digest() == before
    finally:
        del logging.Logger.warning_advice


def test_task_from_a_directory_of_csv_tsv_jsonl_and_parquet(tmp_path):
    d = tmp_path / "csv"
    d.mkdir()
    _write(d / "train.csv", _rows(["pos", "neg", "pos", "neg"]))
    _write(d / "validation.csv", _rows(["neg", "pos"]))
    task = load_task(str(d))
    assert task.kind == "classification" and task.label_names == ["neg", "pos"]
    assert [r["label"] for r in task.splits["validation"]] == [0, 1]
    assert not task.has_pair

    t = tmp_path / "tsv"
    t.mkdir()
    _write(t / "train.tsv", _rows([0.5, 1.25, 3.0], pair=True), sep="\t")
    _write(t / "dev.tsv", _rows([2.5, 0.0], pair=True), sep="\t")
    reg = load_task(str(t))
    assert reg.kind == "regression" and reg.has_pair and reg.metrics == ["pearson", "spearman"]
    assert [r["label"] for r in reg.splits["train"]] == [0.5, 1.25, 3.0]

    j = tmp_path / "jsonl"
    j.mkdir()
    (j / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows([1, 0, 1])))
    (j / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows([0, 1])))
    assert load_task(str(j)).label_names == ["0", "1"]
    changed = j / "validation.jsonl"
    changed.write_text("".join(json.dumps(r) + "\n" for r in _rows([1, 1])))
    assert load_task(str(j)).digest() != load_task(str(d)).digest()


def test_glue_task_from_local_parquet_keeps_its_class_names_and_fields(tmp_path):
    import datasets

    feats = datasets.Features({"sentence1": datasets.Value("string"), "sentence2": datasets.Value("string"),
                               "label": datasets.ClassLabel(names=["not_equivalent", "equivalent"]),
                               "idx": datasets.Value("int32")})
    for split, labels in (("train", [0, 1, 1, 0]), ("validation", [1, 0])):
        rows = {"sentence1": [f"a {i}" for i in range(len(labels))], "sentence2": [f"b {i}" for i in range(len(labels))],
                "label": labels, "idx": list(range(len(labels)))}
        datasets.Dataset.from_dict(rows, features=feats).to_parquet(str(tmp_path / f"{split}.parquet"))
    yaml_path = tmp_path / "mrpc.yaml"
    yaml_path.write_text(f"glue: mrpc\ndata: {tmp_path}\n")
    task = load_task(str(yaml_path))
    assert task.name == "glue/mrpc" and task.metrics == ["accuracy", "f1"]
    assert task.label_names == ["not_equivalent", "equivalent"]
    assert task.splits["validation"][0] == {"text": "a 0", "text_pair": "b 0", "label": 1}


BAD = {
    "missing text field": ([{"sentence": "x", "label": 1}, {"sentence": "y", "label": 0}],
                           [{"sentence": "x", "label": 1}], "no field 'text'"),
    "unseen validation label": (_rows(["a", "b"]), _rows(["c"]), "'c', a label the train split never had"),
    "one class": (_rows(["a", "a"]), _rows(["a"]), "one class only"),
    "empty split": (_rows(["a", "b"]), [], "has no rows"),
    "non-finite target": ([*_rows([0.5, 1.5]), {"text": "t", "label": float("inf")}], _rows([0.5]),
                          "must be a finite number"),
    "pair missing in a row": ([*_rows(["a", "b"], pair=True), {"text": "t", "text_pair": None, "label": "a"}],
                              _rows(["a"], pair=True), "pair field 'text_pair' is None"),
    "wrong shape": ([{"text": "t", "label": "b"}, {"text": {"a": 1}, "label": "a"}], _rows(["a"]),
                    "row 2: field 'text' is {'a': 1}"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_task_is_one_line_and_exit_2_before_anything_runs(case, tmp_path, capsys):
    assert_refused_before_anything_runs(*BAD[case], tmp_path, capsys)


def assert_refused_before_anything_runs(train: list, val: list, expected: str, tmp_path, capsys) -> None:
    """A task directory of these train and validation records: `tpu-ray finetune` exits 2 with one line
    naming it and holding `expected`, and writes nothing (test_downstream_tokens.py uses it too)."""
    d = tmp_path / "task"
    d.mkdir()
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (d / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in val))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # resolve_model only reads it; the task is refused first
    rc = main(["finetune", str(model), "--task", str(d), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and expected in err, err
    assert str(d) in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, expected", [
    (["finetune.learning_rate=1e-4"], "finetune.learning_rate='1e-4': unknown option"),
    (["finetune.learning_rates=[0]"], "finetune.learning_rates=[0]"),
    (["finetune.epochs=0"], "finetune.epochs=0: must be a whole number >= 1"),
])
def test_bad_finetune_option_is_refused(args, expected, tmp_path, capsys):
    rc = main(["finetune", str(tmp_path), "--task", "builtin:stdlib-packages", *args])
    err = capsys.readouterr().err
    assert rc == 2 and expected in err, err


def test_metrics_against_independent_counts():
    y = [0, 1, 1, 0, 1, 1, 0, 0]
    p = [0, 1, 0, 0, 1, 1, 1, 0]
    tp, tn, fp, fn = 3, 3, 1, 1
    got = score(["accuracy", "f1", "macro_f1", "matthews"], y, p)
    assert got["accuracy"] == 6 / 8
    assert got["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert got["macro_f1"] == pytest.approx(0.75)  # both classes: P = R = 3/4
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert got["matthews"] == pytest.approx(mcc)
    import numpy as np

    a, b = [1.0, 2.0, 3.0, 4.5], [1.5, 1.0, 3.5, 9.0]
    reg = score(["pearson", "spearman"], a, b)
    assert reg["pearson"] == pytest.approx(np.corrcoef(a, b)[0, 1])
    assert reg["spearman"] == pytest.approx(np.corrcoef([1, 2, 3, 4], [2, 1, 3, 4])[0, 1])
    # Entity F1: 2 gold entities; one predicted exactly, one with a cut span (wrong) -> P = R = 1/2.
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    pred = [["B-PER", "I-PER", "O", "O"]]
    pred2 = [["B-PER", "O", "O", "B-LOC"]]
    assert score(["entity_f1"], gold, pred)["entity_f1"] == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert score(["entity_f1"], gold, pred2)["entity_f1"] == pytest.approx(0.5)


def test_a_failed_seed_is_reported_and_not_averaged_in():
    ok = [Trial(seed=s, learning_rate=1e-4, result={"metrics": {"accuracy": v}}) for s, v in ((0, 0.5), (1, 0.7))]
    failed = Trial(seed=2, learning_rate=1e-4, status="failed", error="the training loss became nan")
    summary = Summary(task="t", task_hash="h", step=None, trials=[*ok, failed], metric="accuracy", chance=0.25)
    mean, sd, n = summary.stats(1e-4)
    assert (mean, n) == (pytest.approx(0.6), 2) and sd == pytest.approx(math.sqrt(0.02))
    text = "\n".join(summary.lines())
    assert "over 2 of 3 seeds" in text and "seed 2 failed: the training loss became nan" in text
    assert "0.6000 ± 0.1414" in text


def _recorded(run_dir, task_hash, step, accuracies, failed=0):
    from tpu_ray.downstream.sweep import record

    trials = [Trial(seed=s, learning_rate=3e-4, result={"metrics": {"accuracy": a}, "train_examples": 10,
                                                       "examples_per_s": 1.0, "final_loss": 0.5})
              for s, a in enumerate(accuracies)]
    trials += [Trial(seed=len(accuracies) + i, learning_rate=3e-4, status="failed", error="boom") for i in range(failed)]
    trials += [Trial(seed=0, learning_rate=1e-4, result={"metrics": {"accuracy": 0.1}, "train_examples": 10,
                                                         "examples_per_s": 1.0, "final_loss": 0.5})]
    record(str(run_dir), Summary(task="builtin:stdlib-packages", task_hash=task_hash, step=step, trials=trials,
                                 metric="accuracy", chance=0.3))


def test_downstream_records_are_appended_and_shown_by_report_and_compare(tmp_path):
    """Records written by the sweep's own writer: the report's line is the best lr's mean ± sd (counted
    here independently), a second sweep appends, and compare marks runs on different data."""
    import statistics

    from tests.test_report import make_run
    from tpu_ray.comparison import comparison_text
    from tpu_ray.report import load_metrics, text_summary

    a, b = make_run(tmp_path / "a", partial=False), make_run(tmp_path / "b", partial=False)
    _recorded(a, "h" * 64, 500, [0.5, 0.6, 0.7], failed=1)
    _recorded(a, "h" * 64, 500, [0.9])  # a second sweep: appended, its seed 0 beside the first
    _recorded(b, "g" * 64, 500, [0.4, 0.5])
    down = load_metrics(str(a), kind="downstream")
    assert len(down) == 5 + 2  # both sweeps' trials, the failed one included
    text = text_summary(str(a))
    values = [0.5, 0.6, 0.7, 0.9]
    expected = f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"
    assert f"builtin:stdlib-packages at step 500: accuracy {expected} (4 seeds, 1 failed, lr 0.0003)" in text
    cmp = comparison_text([str(a), str(b)])
    assert "downstream builtin:stdlib-packages:" in cmp
    assert "not comparable: the runs were fine-tuned on different data" in cmp
