"""GLUE's nine tasks read from their files as GLUE distributes them (download_glue_data.py's layout),
from a copy of the Hub's parquet files and from a save_to_disk copy (quick: no training, no Ray).

Each task's directory is written here in its real layout (verified against transformers'
data/processors/glue.py, its tests/fixtures/tests_samples/MRPC files, datasets' glue.py and
nyu-mll/GLUE-baselines; see tpu_ray/downstream/glue.py) with synthetic text, a stray `"` in it, and
GLUE's unlabelled test files beside. Labels are checked by the Hub's class names, written out here."""

from __future__ import annotations

import logging

import pytest

from tpu_ray.downstream.glue import GLUE, load_glue_hub, read_glue_dir
from tpu_ray.errors import UserError

pytestmark = pytest.mark.quick

# The Hub's ClassLabel names in index order (datasets' glue.py), and what GLUE's own label values mean.
HUB_NAMES = {"cola": ["unacceptable", "acceptable"], "sst2": ["negative", "positive"],
             "mrpc": ["not_equivalent", "equivalent"], "qqp": ["not_duplicate", "duplicate"], "stsb": [],
             "mnli": ["entailment", "neutral", "contradiction"], "qnli": ["entailment", "not_entailment"],
             "rte": ["entailment", "not_entailment"], "wnli": ["not_entailment", "entailment"]}
ZERO_ONE = {"cola": ("unacceptable", "acceptable"), "sst2": ("negative", "positive"),
            "mrpc": ("not_equivalent", "equivalent"), "qqp": ("not_duplicate", "duplicate"),
            "wnli": ("not_entailment", "entailment")}
FOLDER = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B", "mnli": "MNLI",
          "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
MNLI12 = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
          "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")
MNLI16 = MNLI12.replace("label1\tgold_label", "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")
HEADER = {"sst2": "sentence\tlabel", "mrpc": "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
          "qqp": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
          "stsb": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
          "qnli": "index\tquestion\tsentence\tlabel", "rte": "index\tsentence1\tsentence2\tlabel",
          "wnli": "index\tsentence1\tsentence2\tlabel"}
# GLUE's raw label values per split (train, dev[, dev_mismatched]); every class in train
RAW = {"cola": (["1", "0", "1", "0"], ["0", "1"]), "sst2": (["1", "0", "0"], ["1", "0"]),
       "mrpc": (["1", "0", "1"], ["0", "1"]), "qqp": (["0", "1", "0"], ["1", "0"]),
       "stsb": (["5.000", "3.800", "0.250"], ["2.615", "4"]),
       "mnli": (["neutral", "entailment", "contradiction"], ["contradiction", "neutral"], ["entailment", "neutral"]),
       "qnli": (["entailment", "not_entailment", "entailment"], ["not_entailment", "entailment"]),
       "rte": (["not_entailment", "entailment"], ["entailment", "not_entailment"]),
       "wnli": (["1", "0", "1"], ["0", "1"])}
DEV_FILES = {"mnli": ("dev_matched.tsv", "dev_mismatched.tsv")}


def _text(task, split, i, side="a"):
    """Synthetic text; the second row of every file opens with an unbalanced double quote, as GLUE's
    text does (MRPC: `" The foodservice pie business ...`), which csv's default quoting would run on."""
    body = f"{task} {split} {side} sentence {i} ."
    return f'" {body}' if i == 1 else body


def _line(task, split, i, raw, dev=False):
    a, b = _text(task, split, i, "a"), _text(task, split, i, "b")
    if task == "cola":  # headerless: source, label, the author's mark, sentence
        return f"gj0{i}\t{raw}\t{'*' if raw == '0' else ''}\t{a}"
    if task == "sst2":
        return f"{a} \t{raw}"  # SST-2's sentences end in a space before the tab
    if task == "mrpc":
        return f"{raw}\t{1000 + i}\t{2000 + i}\t{a}\t{b}"
    if task == "qqp":
        return f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{raw}"
    if task == "stsb":
        return f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{a}\t{b}\t{raw}"
    if task == "mnli":  # label1 (one annotator) differs from gold_label, which is last
        parses = f"( ( {i} ) )\t( ( {i} ) )\t(ROOT (S {i}))\t(ROOT (S {i}))"
        annotators = "neutral\tneutral\tcontradiction\tneutral\tentailment" if dev else "neutral"
        return f"{i}\t{500 + i}\t{500 + i}{raw[0]}\tfiction\t{parses}\t{a}\t{b}\t{annotators}\t{raw}"
    return f"{i}\t{a}\t{b}\t{raw}"  # qnli, rte, wnli


def _write_task(root, task):
    """GLUE's directory for `task` under root, as download_glue_data.py leaves it, test files included."""
    d = root / FOLDER[task]
    d.mkdir(parents=True)
    files = ("train.tsv", *DEV_FILES.get(task, ("dev.tsv",)))
    for file, raws in zip(files, RAW[task]):
        split = file[:-4]
        lines = [_line(task, split, i, raw, dev=file != "train.tsv") for i, raw in enumerate(raws)]
        header = [] if task == "cola" else [MNLI16 if task == "mnli" and file != "train.tsv" else
                                             MNLI12 if task == "mnli" else HEADER[task]]
        (d / file).write_text("\n".join(header + lines) + "\n", encoding="utf-8")
    # GLUE's unlabelled test files: another header, no label column; read, they would be refused
    for file in (("test_matched.tsv", "test_mismatched.tsv") if task == "mnli" else ("test.tsv",)):
        (d / file).write_text("index\tsentence\n0\tan unlabelled test sentence\n1\t\"stray\n")
    return d


def _meaning(task, raw):
    """The Hub's class name for GLUE's raw label value (a float for STS-B)."""
    if task == "stsb":
        return float(raw)
    return ZERO_ONE[task][int(raw)] if task in ZERO_ONE else raw


@pytest.mark.parametrize("task", list(GLUE))
def test_glue_distribution_reads_every_task_with_the_hubs_fields_and_label_indices(tmp_path, task):
    spec = GLUE[task]
    assert spec.label_names == HUB_NAMES[task]
    d = _write_task(tmp_path, task)
    got = read_glue_dir(task, str(d))
    splits = ["train", "validation", *spec.extra_eval]
    assert list(got) == splits  # test files ignored
    for split, raws in zip(splits, RAW[task]):
        rows, path, features = got[split]
        file_split = path.rsplit("/", 1)[1][:-4]
        assert path.endswith("train.tsv" if split == "train" else
                             {"validation": "dev_matched.tsv", "validation_mismatched": "dev_mismatched.tsv"}[split]
                             if task == "mnli" else "dev.tsv")
        assert features is None
        assert len(rows) == len(raws)  # the row with the stray quote stayed one row
        assert [r[spec.text_field] for r in rows] == [
            _text(task, file_split, i) + (" " if task == "sst2" else "") for i in range(len(raws))]
        assert rows[1][spec.text_field].startswith('" ')
        if spec.pair_field:
            assert [r[spec.pair_field] for r in rows] == [_text(task, file_split, i, "b") for i in range(len(raws))]
        else:
            assert set(rows[0]) == {spec.text_field, "label", "idx"}
        labels = [r["label"] for r in rows]
        if spec.kind == "regression":
            assert labels == [float(x) for x in raws] and all(isinstance(v, float) for v in labels)
        else:
            assert all(type(v) is int for v in labels)
            assert [spec.label_names[v] for v in labels] == [_meaning(task, x) for x in raws]


def test_cola_one_is_acceptable_and_mnli_scores_gold_label_not_an_annotators(tmp_path):
    cola = read_glue_dir("cola", str(_write_task(tmp_path, "cola")))
    assert [r["label"] for r in cola["validation"][0]] == [0, 1]  # '0' unacceptable, '1' acceptable
    mnli = read_glue_dir("mnli", str(_write_task(tmp_path, "mnli")))
    # dev_matched row 0: label1 'neutral', gold 'contradiction' -> the Hub's index 2
    assert mnli["validation"][0][0]["label"] == 2
    assert [r["label"] for r in mnli["validation_mismatched"][0]] == [0, 1]
    assert mnli["validation_mismatched"][0][0]["hypothesis"] == "mnli dev_mismatched b sentence 0 ."


def test_glue_data_root_bom_and_crlf(tmp_path):
    _write_task(tmp_path, "mnli")
    _write_task(tmp_path, "wnli")
    assert len(read_glue_dir("mnli", str(tmp_path))["train"][0]) == 3  # glue_data/ itself: its MNLI/ is found
    mrpc = _write_task(tmp_path / "x", "mrpc")
    # download_glue_data.py copies msr_paraphrase_train.txt's first line, BOM included, as the header
    body = (mrpc / "train.tsv").read_text()
    (mrpc / "train.tsv").write_text("\ufeff" + body.replace("\n", "\r\n"))
    rows = read_glue_dir("mrpc", str(mrpc))["train"][0]
    assert [r["label"] for r in rows] == [1, 0, 1] and rows[2]["sentence2"] == "mrpc train b sentence 2 ."


def test_qqp_lines_with_missing_fields_are_skipped_as_glues_readers_do(tmp_path, caplog):
    d = _write_task(tmp_path, "qqp")
    lines = (d / "train.tsv").read_text().splitlines()
    # a question with a line break in it: one record cut into two lines of 4 and 3 fields
    lines[2:2] = ["7\t14\t15\tWhy is the", "question cut ?\tWhat is this ?\t0"]
    (d / "train.tsv").write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="tpu_ray.downstream"):
        rows = read_glue_dir("qqp", str(d))["train"][0]
    assert [r["question1"] for r in rows] == [_text("qqp", "train", i) for i in range(3)]
    assert "skipped 2 line(s)" in caplog.text and "line 3" in caplog.text


def _edit(d, file, fn):
    p = d / file
    p.write_text(fn(p.read_text()))


REFUSALS = {
    "a row with too few columns": ("rte", lambda d: _edit(d, "dev.tsv", lambda s: s.replace("\tnot_entailment", "")),
                                   "dev.tsv: line 3 has 3 tab-separated fields, GLUE's dev.tsv has 4"),
    "unknown MNLI label": ("mnli", lambda d: _edit(d, "dev_matched.tsv", lambda s: s[:-len("neutral\n")] + "maybe\n"),
                           "dev_matched.tsv: line 3: gold_label is 'maybe', not one of GLUE's mnli labels"),
    "no train file": ("sst2", lambda d: (d / "train.tsv").unlink(), "no train file for glue/sst2"),
    "no mismatched dev": ("mnli", lambda d: (d / "dev_mismatched.tsv").unlink(), "dev_mismatched.tsv: missing"),
    "CoLA with a header": ("cola", lambda d: _edit(d, "train.tsv", lambda s: "sentence\tlabel\n" + s),
                           "train.tsv: line 1 has 2 tab-separated fields, GLUE's train.tsv has 4 (source, label, "
                           "author_mark, sentence) (CoLA's train.tsv and dev.tsv have no header line)"),
    "another task's file": ("mrpc", lambda d: _edit(d, "dev.tsv", lambda s: HEADER["rte"] + s[s.index("\n"):]),
                            "dev.tsv: line 1 is not GLUE's MRPC header (no column 'Quality', '#1 ID', '#2 ID'"),
    "a score that is no number": ("stsb", lambda d: _edit(d, "dev.tsv", lambda s: s.replace("\t4\n", "\thigh\n")),
                                  "dev.tsv: line 3: score is 'high', not a finite number"),
    "a CoLA label 2": ("cola", lambda d: _edit(d, "dev.tsv", lambda s: s.replace("\t1\t", "\t2\t")),
                       "dev.tsv: line 2: label is '2', not one of GLUE's cola labels (0, 1)"),
    "an empty file": ("wnli", lambda d: (d / "dev.tsv").write_text(""), "dev.tsv: the file is empty"),
    "a header only": ("qnli", lambda d: (d / "dev.tsv").write_text(HEADER["qnli"] + "\n"),
                      "dev.tsv: no rows after the header"),
    "not UTF-8": ("sst2", lambda d: (d / "train.tsv").write_bytes(b"sentence\tlabel\n\xff bad\t1\n"),
                  "train.tsv: not UTF-8 text"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_glue_distribution_refusals_name_the_file_the_line_and_the_fix(tmp_path, case):
    task, damage, expected = REFUSALS[case]
    d = _write_task(tmp_path, task)
    damage(d)
    with pytest.raises(UserError) as err:
        read_glue_dir(task, str(d))
    line = str(err.value)
    assert expected in line and "\n" not in line, line


def test_not_a_directory_and_unknown_task(tmp_path):
    with pytest.raises(UserError, match="not a directory"):
        read_glue_dir("rte", str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="unknown GLUE task 'mnli-mm'"):
        read_glue_dir("mnli-mm", str(tmp_path))


def _hub_features(task):
    import datasets

    spec = GLUE[task]
    feats = {spec.text_field: datasets.Value("string")}
    if spec.pair_field:
        feats[spec.pair_field] = datasets.Value("string")
    feats["label"] = (datasets.ClassLabel(names=spec.label_names) if spec.label_names else datasets.Value("float32"))
    feats["idx"] = datasets.Value("int32")
    return datasets.Features(feats)


def _hub_dataset(task, rows):
    import datasets

    cols = list(_hub_features(task))
    return datasets.Dataset.from_dict({c: [r[c] for r in rows] for c in cols}, features=_hub_features(task))


def test_hub_parquet_copy_gives_the_same_rows_as_glues_files(tmp_path):
    tsv = read_glue_dir("mnli", str(_write_task(tmp_path / "glue", "mnli")))
    hub = tmp_path / "hub" / "mnli"  # the Hub repository's config folder
    hub.mkdir(parents=True)
    names = {"train": "train", "validation": "validation_matched", "validation_mismatched": "validation_mismatched"}
    for split, (rows, _, _) in tsv.items():
        _hub_dataset("mnli", rows).to_parquet(str(hub / f"{names[split]}-00000-of-00001.parquet"))
    unlabelled = [dict(r, label=-1) for r in tsv["validation"][0]]
    _hub_dataset("mnli", unlabelled).to_parquet(str(hub / "test_matched-00000-of-00001.parquet"))

    got = read_glue_dir("mnli", str(tmp_path / "hub"))
    assert list(got) == ["train", "validation", "validation_mismatched"]
    for split in got:
        rows, path, features = got[split]
        assert rows == tsv[split][0]
        assert path.endswith(f"mnli/{names[split]}-00000-of-00001.parquet")
        assert features["label"].names == ["entailment", "neutral", "contradiction"]


def test_hub_parquet_refusals(tmp_path):
    import datasets

    rows = [{"sentence1": "a", "sentence2": "b", "label": 1, "idx": 0}]
    _hub_dataset("rte", rows).to_parquet(str(tmp_path / "train-00000-of-00001.parquet"))
    with pytest.raises(UserError, match=r"no validation file \(validation-00000-of-00001.parquet\)"):
        read_glue_dir("rte", str(tmp_path))
    _hub_dataset("rte", [dict(rows[0], label=-1)]).to_parquet(str(tmp_path / "validation-00000-of-00001.parquet"))
    with pytest.raises(UserError, match=r"validation-00000-of-00001.parquet: row 1: label is -1, not a class index "
                                        r"0 to 1 \(entailment, not_entailment\) \(-1 marks an unlabelled test row"):
        read_glue_dir("rte", str(tmp_path))
    feats = _hub_features("rte")
    feats["label"] = datasets.ClassLabel(names=["not_entailment", "entailment"])  # WNLI's order
    datasets.Dataset.from_dict({k: [v] for k, v in rows[0].items()}, features=feats).to_parquet(
        str(tmp_path / "validation-00000-of-00001.parquet"))
    with pytest.raises(UserError, match="its label classes are not_entailment, entailment, not the Hub's rte"):
        read_glue_dir("rte", str(tmp_path))


def test_save_to_disk_copy(tmp_path):
    import datasets

    tsv = read_glue_dir("stsb", str(_write_task(tmp_path / "glue", "stsb")))
    test = [dict(r, label=-1.0) for r in tsv["validation"][0]]
    dd = datasets.DatasetDict({"train": _hub_dataset("stsb", tsv["train"][0]),
                               "validation": _hub_dataset("stsb", tsv["validation"][0]),
                               "test": _hub_dataset("stsb", test)})
    dd.save_to_disk(str(tmp_path / "disk"))
    got = read_glue_dir("stsb", str(tmp_path / "disk"))
    assert list(got) == ["train", "validation"]
    rows, path, features = got["validation"]
    assert path.endswith("disk/validation") and features["label"].dtype == "float32"
    assert [r["label"] for r in rows] == pytest.approx([2.615, 4.0])
    assert [r["sentence1"] for r in rows] == [r["sentence1"] for r in tsv["validation"][0]]


def test_hub_load_offline_is_one_line():
    """The real Hub loader, offline as the tests run (HF_DATASETS_OFFLINE=1, no cache): one line, the fix."""
    with pytest.raises(UserError) as err:
        load_glue_hub("cola")
    assert "\n" not in str(err.value) and "give the task's files instead: data: DIR" in str(err.value)


def test_glue_task_yaml_on_glues_files_keeps_mnli_mismatched(tmp_path):
    from tpu_ray.downstream.tasks import load_task

    d = _write_task(tmp_path, "mnli")
    (tmp_path / "mnli.yaml").write_text(f"glue: mnli\ndata: {d}\n")
    task = load_task(str(tmp_path / "mnli.yaml"))
    assert task.label_names == ["entailment", "neutral", "contradiction"] and task.metrics == ["accuracy"]
    assert task.eval_splits == ["validation", "validation_mismatched"]
    assert task.splits["validation"][0] == {"text": "mnli dev_matched a sentence 0 .",
                                            "text_pair": "mnli dev_matched b sentence 0 .", "label": 2}


def test_qqp_rows_with_an_empty_question_are_kept_as_the_hub_keeps_them(tmp_path):
    """Real QQP train has two rows whose question2 is empty, all six fields present."""
    from tpu_ray.downstream.tasks import load_task

    d = _write_task(tmp_path, "qqp")
    lines = (d / "train.tsv").read_text().splitlines()
    lines.append("9\t18\t19\tWhat is an empty question ?\t\t0")
    (d / "train.tsv").write_text("\n".join(lines) + "\n")
    (tmp_path / "qqp.yaml").write_text(f"glue: qqp\ndata: {d}\n")
    task = load_task(str(tmp_path / "qqp.yaml"))
    assert task.splits["train"][-1] == {"text": "What is an empty question ?", "text_pair": "", "label": 0}
