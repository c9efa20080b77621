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
    changed.write_text("".join(json.dumps(r) + "\n" for r in _rows([1, 0])))
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
    assert task.name == "glue/mrpc" and task.metrics == ["f1", "accuracy"]  # GLUE's headline for MRPC: F1
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
    # integer labels are classes by value: validation's 3 is unseen, never read as index 3 ('5')
    "unseen integer label": (_rows([1, 2, 4, 5]), _rows([5, 3, 0]), "row 2: 'label' is 3, a label the train split"),
    "unseen integer label 0": (_rows([1, 2, 4, 5]), _rows([5, 0]), "row 2: 'label' is 0, a label the train split"),
    "one class in validation": (_rows(["a", "b"]), _rows(["a"]), "the validation split has one class only ('a')"),
    "validation is train": (_rows(["a", "b"]), _rows(["a", "b"]), "the validation split is the train split's rows"),
    "label with spaces": (_rows(["a", " b"]), _rows(["a"]), "row 2: 'label' is ' b', which has spaces at its ends"),
    "label in NFD": (_rows(["cafe\u0301", "b"]), _rows(["b"]), "is not in Unicode NFC form"),
    "blank text": ([*_rows(["a", "b"]), {"text": "   ", "label": "a"}], _rows(["a"]), "row 3: field 'text' is '   '"),
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
    (["finetune.learning_rates=[1e-4,1e-4]"], "a learning rate twice"),
    (["finetune.epochs=0"], "finetune.epochs=0: must be a whole number >= 1"),
    (["finetune.cpus_per_trial=0"], "finetune.cpus_per_trial=0: must be a number > 0"),
    (["finetune.cpus_per_trial=-1"], "finetune.cpus_per_trial=-1: must be a number > 0"),
    (["finetune.gpus_per_trial=-1"], "finetune.gpus_per_trial=-1: must be a number >= 0"),
    (["finetune.weight_decay=-5"], "finetune.weight_decay=-5: must be a number in [0, 1)"),
    (["finetune.max_train_examples=-400"], "finetune.max_train_examples=-400: a whole number >= 0"),
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


def _ok(seed, lr, val, test=None):
    scores = {"validation": {"accuracy": val}, **({"test": {"accuracy": test}} if test is not None else {})}
    return Trial(seed=seed, learning_rate=lr, result={"scores": scores, "truncated_share": 0.0})


def test_a_failed_seed_is_reported_and_not_averaged_in():
    ok = [_ok(0, 1e-4, 0.5), _ok(1, 1e-4, 0.7)]
    failed = Trial(seed=2, learning_rate=1e-4, status="failed", error="the training loss became nan")
    summary = Summary(task="t", task_hash="h", step=None, trials=[*ok, failed], metric="accuracy", chance=0.25)
    mean, sd, n = summary.stats(1e-4)
    assert (mean, n) == (pytest.approx(0.6), 2) and sd == pytest.approx(math.sqrt(0.02))
    text = "\n".join(summary.lines())
    assert "over 2 of 3 seeds" in text and "seed 2 failed: the training loss became nan" in text
    assert "0.6000 ± 0.1414" in text
    assert "validation accuracy: 0.6000" in text and "optimistic" in text  # no test split: named for what it is


def test_summary_reports_test_at_the_rate_chosen_on_validation_and_warns_at_the_grid_edge():
    trials = [_ok(s, 1e-4, 0.6, 0.70) for s in range(2)] + [_ok(s, 3e-4, 0.8, 0.5 + s / 10) for s in range(2)]
    summary = Summary(task="t", task_hash="h", step=None, trials=trials, metric="accuracy", chance=0.25,
                      report_split="test")
    assert summary.best_lr == 3e-4 and summary.seed_scores() == {0: 0.5, 1: 0.6}
    text = "\n".join(summary.lines())
    assert "t test accuracy: 0.5500 ± 0.0707 over 2 seeds at lr 0.0003 (held out; lr chosen on validation, 0.8000" in text
    assert "the chosen learning rate 0.0003 is the grid's largest" in text and "add 9e-04" in text
    inner = Summary(task="t", task_hash="h", step=None, metric="accuracy", chance=None, report_split="test",
                    trials=trials + [_ok(0, 1e-3, 0.7, 0.7)])
    assert inner.edge_warning() is None


def test_default_grid_fits_the_model_and_max_length_is_run_glues(tmp_path):
    from tpu_ray.downstream.finetune import FinetuneSpec, default_learning_rates

    assert FinetuneSpec().max_length == 128 and FinetuneSpec().learning_rates is None
    for width, grid in ((768, [1e-5, 2e-5, 3e-5]), (1024, [1e-5, 2e-5, 3e-5]), (128, [1e-4, 3e-4, 1e-3])):
        (tmp_path / "config.json").write_text(json.dumps({"hidden_size": width}))
        assert default_learning_rates(str(tmp_path))[0] == grid


def test_integer_labels_are_classes_by_value(tmp_path):
    d = tmp_path / "ints"
    d.mkdir()
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows([1, 2, 4, 5])))
    (d / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows([5, 1, 4])))
    task = load_task(str(d))
    assert task.label_names == ["1", "2", "4", "5"]
    assert [task.label_names[r["label"]] for r in task.splits["validation"]] == ["5", "1", "4"]


def test_true_false_labels_are_two_named_classes(tmp_path):
    d = tmp_path / "bools"
    d.mkdir()
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows([True, False, True])))
    (d / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows([False, True])))
    task = load_task(str(d))
    assert task.label_names == ["False", "True"]
    assert [task.label_names[r["label"]] for r in task.splits["validation"]] == ["False", "True"]


def test_integer_labels_with_class_names_are_indices(tmp_path):
    """A ClassLabel (as every Hub dataset ships labels) or label_names: an integer is an index."""
    import datasets

    feats = datasets.Features({"text": datasets.Value("string"),
                               "label": datasets.ClassLabel(names=["neg", "neutral", "pos"])})
    for split, labels in (("train", [0, 2, 1, 2]), ("validation", [2, 0]), ("test", [1, 1, 0])):
        datasets.Dataset.from_dict({"text": [f"text {i}" for i in range(len(labels))], "label": labels},
                                   features=feats).to_parquet(str(tmp_path / f"{split}.parquet"))
    task = load_task(str(tmp_path))
    assert task.label_names == ["neg", "neutral", "pos"] and task.report_split == "test"
    assert [r["label"] for r in task.splits["validation"]] == [2, 0]
    assert [r["label"] for r in task.splits["test"]] == [1, 1, 0]
    assert task.chance() == pytest.approx(2 / 3)  # the reported split's largest class


def test_an_unlabelled_test_split_is_dropped_and_a_labelled_one_reported(tmp_path, caplog):
    d = tmp_path / "t"
    d.mkdir()
    _write(d / "train.csv", _rows(["a", "b", "a"]))
    _write(d / "validation.csv", _rows(["a", "b"]))
    (d / "test.csv").write_text("text\nno label here\n")
    task = load_task(str(d))
    assert "test" not in task.splits and task.report_split == "validation"
    assert "the test split has no labels" in caplog.text
    _write(d / "test.csv", _rows(["b", "b", "a"]))
    assert load_task(str(d)).report_split == "test"


def test_a_train_sample_is_drawn_not_the_first_rows():
    from tpu_ray.downstream.tasks import Task

    rows = [{"text": f"t{i}", "label": 0 if i < 50 else 1} for i in range(100)]  # sorted by label
    task = Task(name="t", kind="classification", splits={"train": rows, "validation": rows[:2]},
                label_names=["a", "b"], metrics=["accuracy"])
    sample = task.train_rows(20)
    assert len(sample) == 20 and {r["label"] for r in sample} == {0, 1}
    assert sample == task.train_rows(20)  # the same for every trial
    assert task.train_rows(0) == rows and task.train_rows(500) == rows


def _small_task_and_model(tmp_path):
    """A two-class task directory and a model directory whose config.json is all `finetune` reads
    before it refuses (the refusals below come before any model loads)."""
    d = tmp_path / "task"
    d.mkdir()
    _write(d / "train.csv", _rows(["a", "b"]))
    _write(d / "validation.csv", [{"text": f"held out {r['label']}", "label": r["label"]} for r in _rows(["a", "b"])])
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 32}))
    return d, model


def test_export_dir_through_a_link_or_over_an_earlier_sweep_is_refused(tmp_path, capsys):
    d, model = _small_task_and_model(tmp_path)
    (model / "tf_model.h5").write_bytes(b"weights")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    earlier = tmp_path / "earlier"
    (earlier / "lr0.001-seed1").mkdir(parents=True)
    for export, expected in ((tmp_path / "link", "a link"), (earlier, "holds lr0.001-seed1")):
        rc = main(["finetune", str(model), "--task", str(d), "--output-dir", str(tmp_path / "out"), "--seeds", "2",
                   "finetune.learning_rates=[1e-3]", f"finetune.export_dir={export}"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and expected in err and len(err.splitlines()) == 1, err
    assert not any(target.iterdir())


def test_finetune_refuses_a_record_directory_another_command_holds(tmp_path, capsys):
    from tpu_ray.runlock import RunLock

    d, model = _small_task_and_model(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    with RunLock(str(out), "tpu-ray run"):
        rc = main(["finetune", str(model), "--task", str(d), "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "tpu-ray run" in err, err
    assert not (out / "metrics.jsonl").exists()


def test_a_stray_quote_in_a_tsv_is_text_not_a_field_that_swallows_rows(tmp_path):
    d = tmp_path / "task"
    d.mkdir()
    rows = _rows(["a", "b", "a", "b"])
    rows[1]["text"] = 'he said "stop and left'  # one quote, never closed
    _write(d / "train.tsv", rows, sep="\t")
    _write(d / "validation.tsv", _rows(["a", "b"]), sep="\t")
    task = load_task(str(d))
    assert [r["text"] for r in task.splits["train"]] == [r["text"] for r in rows]
    assert [r["label"] for r in task.splits["train"]] == [0, 1, 0, 1]


def _yaml_task(tmp_path, labels, **opts):
    import yaml

    d = tmp_path / "data"
    d.mkdir(exist_ok=True)
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(labels)))
    (d / "validation.jsonl").write_text("".join(json.dumps({**r, "text": "held out " + r["text"]}) + "\n"
                                                for r in _rows(labels)))
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump({"data": str(d), "metrics": ["f1", "accuracy"], **opts}))
    return str(path)


def test_binary_f1_needs_two_classes_and_a_named_positive_one(tmp_path):
    from tpu_ray.errors import UserError

    with pytest.raises(UserError, match=r"labels \['no', 'yes'\] do not say which; add positive_label: yes"):
        load_task(_yaml_task(tmp_path, ["yes", "no", "yes", "no"]))
    with pytest.raises(UserError, match="binary F1, for two classes; this task has 3 classes; score macro_f1"):
        load_task(_yaml_task(tmp_path, ["a", "b", "c"]))
    with pytest.raises(UserError, match="positive_label='maybe' is not a class"):
        load_task(_yaml_task(tmp_path, ["yes", "no"], positive_label="maybe"))
    # `no` sorts first (class 0): naming it positive makes it class 1, the one F1 scores
    task = load_task(_yaml_task(tmp_path, ["yes", "no", "no", "yes"], positive_label="no"))
    assert task.label_names == ["yes", "no"] and [r["label"] for r in task.splits["train"]] == [0, 1, 1, 0]
    truth = [r["label"] for r in task.splits["validation"]]
    guess = [1, 1, 1, 0]  # predicts `no` three times: 2 of them right; recall of `no` 1, precision 2/3
    assert score(["f1"], truth, guess)["f1"] == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))


def test_a_model_is_identified_by_what_a_trial_loads(tmp_path):
    """save_pretrained copies config.json (and tpu-ray's export provenance in it) into a model trained
    further or re-initialised, and leaves an old model.safetensors beside the new tf_model.h5: only the
    h5's weights (what a trial loads), the config without provenance and the tokenizer tell models apart."""
    import h5py
    import numpy as np
    from safetensors.numpy import save_file

    from tpu_ray.downstream.finetune import model_fingerprint

    def model(name, weights, config=None, tokenizer="{}", step=500):
        d = tmp_path / name
        d.mkdir()
        cfg = {"hidden_size": 8, "tpu_ray_export": {"config_sha256": "c" * 64, "step": step}, **(config or {})}
        (d / "config.json").write_text(json.dumps(cfg))
        with h5py.File(d / "tf_model.h5", "w") as f:
            f.create_dataset("layer/kernel", data=np.array(weights, dtype=np.float32))
            f.attrs["written"] = name  # HDF5 metadata: not a weight
        save_file({"w": np.zeros(2, dtype=np.float32)}, str(d / "model.safetensors"))  # a stale PyTorch copy
        (d / "tokenizer.json").write_text(tokenizer)
        return model_fingerprint(str(d))

    base = model("a", [1, 2])
    assert model("same-weights-written-again", [1, 2], step=900) == base  # provenance and HDF5 metadata aside
    assert model("retrained", [1, 3]) != base
    assert model("other-dropout", [1, 2], config={"hidden_dropout_prob": 0.3}) != base
    assert model("other-tokenizer", [1, 2], tokenizer='{"x": 1}') != base


def test_trials_kept_off_tpu_hosts_are_refused_when_only_a_tpu_host_could_hold_them():
    """ray.nodes()' shape: a TPU host with 96 CPUs and a 2-CPU node; eval.downstream keeps its trials off
    the TPU host, so a 4-CPU trial fits nowhere it may run."""
    from tpu_ray.downstream.finetune import FinetuneSpec
    from tpu_ray.downstream.sweep import check_resources
    from tpu_ray.errors import UserError

    nodes = [{"Alive": True, "Resources": {"CPU": 96.0, "TPU": 4.0}, "Labels": {"ray.io/accelerator-type": "TPU-V4"}},
             {"Alive": True, "Resources": {"CPU": 2.0}, "Labels": {}}]
    spec = FinetuneSpec(cpus_per_trial=4)
    check_resources(spec, nodes)  # `tpu-ray finetune` may use the TPU host's CPUs
    with pytest.raises(UserError, match="no node of this Ray cluster off its TPU hosts has that much .*largest has 2 CPUs"):
        check_resources(spec, nodes, off_tpu=True)


def test_a_metric_that_does_not_score_the_kind_is_refused(tmp_path):
    from tpu_ray.errors import UserError

    with pytest.raises(UserError, match="metric 'pearson' does not score a classification task; it takes accuracy"):
        load_task(_yaml_task(tmp_path, ["a", "b"], metrics=["pearson"]))


def test_a_new_task_kind_is_one_class_and_a_registry_entry(tmp_path, monkeypatch):
    """The task checks ask the kind object, never its name: a kind registered in KINDS is read,
    checked and headed by its own rules."""
    from tpu_ray.downstream.kinds import KINDS, Classification

    class Sentiment(Classification):
        name = "sentiment"
        metrics = ["matthews"]

        def head(self, label_names):
            return {**super().head(label_names), "classifier_dropout": 0.0}

    monkeypatch.setitem(KINDS, "sentiment", Sentiment())
    task = load_task(_yaml_task(tmp_path, ["pos", "neg"], kind="sentiment", metrics=None))
    assert (task.kind, task.metrics, task.label_names) == ("sentiment", ["matthews"], ["neg", "pos"])
    assert task.kind_obj.head(task.label_names)["classifier_dropout"] == 0.0


def test_a_split_with_its_own_class_label_is_matched_to_train_by_name(tmp_path):
    """Validation saved with ClassLabel(names=sorted(set(its labels))): its 1 is `pos`, train's 2."""
    import datasets

    three = datasets.ClassLabel(names=["neg", "neutral", "pos"])
    two = datasets.ClassLabel(names=["neg", "pos"])
    train = datasets.Dataset.from_dict({"text": ["bad", "fine", "great", "awful"], "label": [0, 1, 2, 0]},
                                       features=datasets.Features({"text": datasets.Value("string"), "label": three}))
    val = datasets.Dataset.from_dict({"text": ["superb", "dire"], "label": [1, 0]},
                                     features=datasets.Features({"text": datasets.Value("string"), "label": two}))
    datasets.DatasetDict({"train": train, "validation": val}).save_to_disk(str(tmp_path / "d"))
    task = load_task(str(tmp_path / "d"))
    assert task.label_names == ["neg", "neutral", "pos"]
    assert [task.label_names[r["label"]] for r in task.splits["validation"]] == ["pos", "neg"]


def test_split_files_are_named_exactly(tmp_path, caplog):
    from tpu_ray.errors import UserError

    d = tmp_path / "task"
    d.mkdir()
    _write(d / "train.csv", _rows(["a", "b"]))
    _write(d / "train.small.csv", _rows(["a", "b", "a"]))
    _write(d / "validation.csv", [{"text": f"held out {i}", "label": x} for i, x in enumerate("ab")])
    assert len(load_task(str(d)).splits["train"]) == 2  # train.small.csv is not read into train
    assert "train.small.csv not read" in caplog.text
    _write(d / "train.jsonl", _rows(["a", "b"]))
    with pytest.raises(UserError, match="2 train files \\(train.csv, train.jsonl\\); keep one"):
        load_task(str(d))


def test_task_yaml_keys_that_would_be_ignored_are_refused(tmp_path):
    from tpu_ray.errors import UserError

    glue = tmp_path / "glue.yaml"
    glue.write_text("glue: mrpc\nmetrics: [accuracy]\n")
    with pytest.raises(UserError, match="'metrics' with glue: GLUE's tasks have"):
        load_task(str(glue))
    with pytest.raises(UserError, match="positive_label is read by metrics: \\[f1\\] only"):
        load_task(_yaml_task(tmp_path, ["a", "b"], metrics=["accuracy"], positive_label="a"))
    with pytest.raises(UserError, match="positive_label=True is not a class .*quote it"):
        load_task(_yaml_task(tmp_path, ["yes", "no"], positive_label=True))
    with pytest.raises(UserError, match="text_field and label_field are both 'text'"):
        load_task(_yaml_task(tmp_path, ["a", "b"], text_field="text", label_field="text"))
