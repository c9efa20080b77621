"""GLUE's nine tasks read as GLUE ships them, as the Hugging Face Hub ships them, or from the Hub.

`data` for a task is one of:
- GLUE's own directory for it, as download_glue_data.py leaves it (CoLA/, SST-2/, MRPC/, QQP/, STS-B/,
  MNLI/, QNLI/, RTE/, WNLI/; the glue_data/ directory above them works too): train.tsv and dev.tsv
  (MNLI: dev_matched.tsv and dev_mismatched.tsv). GLUE's test files carry no labels and are never read;
  nor is anything else there (MRPC's msr_paraphrase_*.txt and dev_ids.tsv, the original/ folders).
- a local copy of the Hub's parquet files of nyu-mll/glue (`train-00000-of-00001.parquet`,
  `validation-…` or MNLI's `validation_matched-…` and `validation_mismatched-…`), in the directory or in
  a subdirectory named after the config (`mnli/`), as the Hub's repository holds them; the parquet
  export branch's `train/0000.parquet` works too. Test splits (every label -1) are never read.
- a `datasets` save_to_disk directory (dataset_dict.json) of the Hub's dataset.

Every source gives the same rows: dicts keyed by the Hub's field names with "label" the Hub's
ClassLabel index (a float score for STS-B), so a model trained from GLUE's files and one trained from
the Hub's are scored on the same labels. Anything else is one line naming the file, the line or field,
and the fix (tpu_ray.errors.UserError).

Verified against (read, not copied):
- huggingface/transformers src/transformers/data/processors/glue.py: the columns each task's text,
  pair and label sit in, which files have a header (all but CoLA's train/dev), MNLI's dev_matched.tsv /
  dev_mismatched.tsv with the label last, QQP's lines with missing fields (skipped there), STS-B's score
  last.
- huggingface/transformers tests/fixtures/tests_samples/MRPC/train.tsv, dev.tsv: real GLUE MRPC files,
  header `Quality	#1 ID	#2 ID	#1 String	#2 String`, text with unbalanced `"`.
- huggingface/datasets datasets/glue/glue.py: the Hub's field names, ClassLabel names in index order,
  each task's label column by header name (is_acceptable for CoLA, Quality, is_duplicate, score,
  gold_label, label), csv with quoting=QUOTE_NONE, CoLA's train/dev the only headerless files, rows
  with missing fields dropped.
- nyu-mll/GLUE-baselines download_glue_data.py (the directory names; MRPC's train/dev written with the
  header of msr_paraphrase_train.txt, which starts with a UTF-8 BOM, hence utf-8-sig here) and
  src/tasks.py (column indices: MNLI gold_label 11 in train, 15 in dev; STS-B score 9; RTE/QNLI 3).
- fastnlp/fastNLP fastNLP/io/loader/matching.py (MNLILoader, QNLILoader, RTELoader): MNLI's 12-column
  train header, QNLI's `index question sentence label`, RTE's `index sentence1 sentence2 label` with
  their first rows. MNLI's 16-column dev header (label1..label5 then gold_label), STS-B's 10-column
  header, QQP's `id qid1 qid2 question1 question2 is_duplicate`, SST-2's `sentence label` and CoLA's
  4 headerless columns (source, label, the author's `*`, sentence) agree with the column indices of
  the two readers above; WNLI's header names are those datasets' glue.py reads.
- the Hub's nyu-mll/glue file layout (`<config>/<split>-00000-of-00001.parquet`; mnli's
  validation_matched / validation_mismatched / test_*): huggingface.co/datasets/nyu-mll/glue's tree.
"""

from __future__ import annotations

import glob
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Generator, Iterator

from tpu_ray.errors import UserError
from tpu_ray.downstream.kinds import KINDS

log = logging.getLogger("tpu_ray.downstream")
HUB_ID = "nyu-mll/glue"


@dataclass(frozen=True)
class GlueTask:
    """A GLUE task as tpu-ray fine-tunes it: the Hub's field names, its kind, its official metric first."""

    name: str
    text_field: str
    pair_field: str | None
    kind: str  # "classification" or "regression"
    metrics: list[str]  # GLUE's headline metric first
    label_names: list[str]  # the Hub's ClassLabel names, index order; [] for stsb
    extra_eval: tuple[str, ...] = ()  # labelled evaluation splits beyond train and validation


_BINARY_ENTAIL = ["entailment", "not_entailment"]
GLUE: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("cola", "sentence", None, "classification", ["matthews", "accuracy"], ["unacceptable", "acceptable"]),
    GlueTask("sst2", "sentence", None, "classification", ["accuracy"], ["negative", "positive"]),
    GlueTask("mrpc", "sentence1", "sentence2", "classification", ["f1", "accuracy"],
             ["not_equivalent", "equivalent"]),
    GlueTask("qqp", "question1", "question2", "classification", ["f1", "accuracy"], ["not_duplicate", "duplicate"]),
    GlueTask("stsb", "sentence1", "sentence2", "regression", ["pearson", "spearman"], []),
    GlueTask("mnli", "premise", "hypothesis", "classification", ["accuracy"],
             ["entailment", "neutral", "contradiction"], ("validation_mismatched",)),
    GlueTask("qnli", "question", "sentence", "classification", ["accuracy"], list(_BINARY_ENTAIL)),
    GlueTask("rte", "sentence1", "sentence2", "classification", ["accuracy"], list(_BINARY_ENTAIL)),
    GlueTask("wnli", "sentence1", "sentence2", "classification", ["accuracy"], ["not_entailment", "entailment"]),
)}


@dataclass(frozen=True)
class _Tsv:
    """How GLUE's distribution lays a task out: its folder, the columns, where text/pair/label are."""

    folder: str
    columns: tuple[str, ...]  # the header's names that must be there (all of them for headerless CoLA)
    text: str
    pair: str | None
    label: str
    files: tuple[tuple[str, str], ...]  # (split, file) beside train.tsv
    headerless: bool = False
    values: dict[str, int] | None = None  # GLUE's label value -> the Hub's index; None: a float score
    skip_broken: bool = False  # QQP: lines with the wrong number of fields dropped, as transformers/datasets do


_ZERO_ONE = {"0": 0, "1": 1}  # GLUE's 0/1 columns; the Hub's ClassLabel puts the negative class at 0
_DEV = (("validation", "dev.tsv"),)
_PAIR_HEADER = ("index", "sentence1", "sentence2", "label")
_TSV: dict[str, _Tsv] = {
    # headerless: source, label, the author's mark ('*' or empty), sentence
    "cola": _Tsv("CoLA", ("source", "label", "author_mark", "sentence"), "sentence", None, "label", _DEV,
                 headerless=True, values=_ZERO_ONE),
    "sst2": _Tsv("SST-2", ("sentence", "label"), "sentence", None, "label", _DEV, values=_ZERO_ONE),
    "mrpc": _Tsv("MRPC", ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"), "#1 String", "#2 String",
                 "Quality", _DEV, values=_ZERO_ONE),
    "qqp": _Tsv("QQP", ("id", "qid1", "qid2", "question1", "question2", "is_duplicate"), "question1", "question2",
                "is_duplicate", _DEV, values=_ZERO_ONE, skip_broken=True),
    "stsb": _Tsv("STS-B", ("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
                           "sentence2", "score"), "sentence1", "sentence2", "score", _DEV),
    # train has 12 columns (label1, gold_label), dev 16 (label1..label5, gold_label): found by name
    "mnli": _Tsv("MNLI", ("sentence1", "sentence2", "gold_label"), "sentence1", "sentence2", "gold_label",
                 (("validation", "dev_matched.tsv"), ("validation_mismatched", "dev_mismatched.tsv")),
                 values={"entailment": 0, "neutral": 1, "contradiction": 2}),
    "qnli": _Tsv("QNLI", ("index", "question", "sentence", "label"), "question", "sentence", "label", _DEV,
                 values={"entailment": 0, "not_entailment": 1}),
    "rte": _Tsv("RTE", _PAIR_HEADER, "sentence1", "sentence2", "label", _DEV,
                values={"entailment": 0, "not_entailment": 1}),
    # WNLI's 1 is entailment, the Hub's index 1 ("not_entailment" first)
    "wnli": _Tsv("WNLI", _PAIR_HEADER, "sentence1", "sentence2", "label", _DEV, values=_ZERO_ONE),
}


def _task(name: str) -> GlueTask:
    if name not in GLUE:
        raise UserError(f"unknown GLUE task {name!r}; one of {', '.join(GLUE)}")
    return GLUE[name]


def _hub_split(name: str, split: str) -> str:
    """The Hub's name of a split: MNLI's validation is validation_matched."""
    return "validation_matched" if name == "mnli" and split == "validation" else split


def _splits(name: str) -> tuple[str, ...]:
    return ("train", "validation", *GLUE[name].extra_eval)


def read_glue_dir(name: str, data: str) -> dict[str, tuple[list[dict], str, Any]]:
    """{split: (rows, first file path, datasets features or None)} for train, validation and the task's
    extra_eval splits, from GLUE's distribution directory, a copy of the Hub's parquet files or a
    save_to_disk directory (see the module's docstring). Labels are the Hub's ClassLabel indices
    (STS-B: float scores)."""
    _task(name)
    data = str(data)
    if not os.path.isdir(data):
        raise UserError(f"{data}: not a directory; give GLUE's {_TSV[name].folder}/ directory (train.tsv, dev.tsv) "
                        f"or a copy of the Hub's {HUB_ID} {name}/ parquet files")
    layout, where = _layout(name, data)
    if layout == "tsv":
        return _read_tsv_dir(name, where)
    if layout == "disk":
        return _read_disk(name, where)
    return _read_parquet_dir(name, where)


def load_glue_hub(name: str) -> dict[str, tuple[list[dict], str, Any]]:
    """The same from datasets.load_dataset("nyu-mll/glue", name) (its cache, or the network)."""
    _task(name)  # an unknown name refused before the Hub is asked
    import datasets

    datasets.disable_progress_bars()
    try:
        dd = datasets.load_dataset(HUB_ID, name)
    except Exception as exc:  # offline, no cache, the Hub unreachable: all the same to the user
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        raise UserError(f"glue/{name}: could not load {HUB_ID} {name} from the Hub ({type(exc).__name__}: {reason}); "
                        f"give the task's files instead: data: DIR with GLUE's {_TSV[name].folder}/ (train.tsv, "
                        f"dev.tsv) or the Hub's {name}/*.parquet copied there") from None
    return _dataset_dict_rows(name, dd, f"{HUB_ID}/{name}", "update datasets or give the task's files with data: DIR")


# -- which layout ---------------------------------------------------------------------------------------

def _layout(name: str, data: str) -> tuple[str, str]:
    """("tsv" | "disk" | "parquet", directory): the directory itself, else GLUE's folder for the task
    under it (glue_data/MNLI) or the Hub's config folder (mnli/)."""
    folder = _TSV[name].folder
    for where in (data, os.path.join(data, folder), os.path.join(data, name)):
        if os.path.isfile(os.path.join(where, "train.tsv")):
            return "tsv", where
        if os.path.isfile(os.path.join(where, "dataset_dict.json")):
            return "disk", where
        if _parquet_files(where, "train"):
            return "parquet", where
    raise UserError(f"{data}: no train file for glue/{name}; give GLUE's {folder}/ directory (train.tsv), a copy of "
                    f"the Hub's {HUB_ID} {name}/ files (train-00000-of-00001.parquet) or a save_to_disk directory "
                    f"(dataset_dict.json)")


def _parquet_files(where: str, split: str) -> list[str]:
    """The Hub's shards of a split: `train-00000-of-00001.parquet`, `train.parquet`, or the parquet
    export's `train/0000.parquet`."""
    if not os.path.isdir(where):
        return []
    found = {*glob.glob(os.path.join(glob.escape(where), f"{split}-*.parquet")),
             *glob.glob(os.path.join(glob.escape(where), split, "*.parquet"))}
    single = os.path.join(where, f"{split}.parquet")
    if os.path.isfile(single):
        found.add(single)
    return sorted(found)


# -- GLUE's distribution ------------------------------------------------------------------------------

def _read_tsv_dir(name: str, where: str) -> dict[str, tuple[list[dict], str, Any]]:
    layout = _TSV[name]
    out = {"train": (_read_tsv(name, os.path.join(where, "train.tsv")), os.path.join(where, "train.tsv"), None)}
    for split, file in layout.files:
        path = os.path.join(where, file)
        if not os.path.isfile(path):
            raise UserError(f"{path}: missing; GLUE's {layout.folder}/ has train.tsv and "
                            f"{' and '.join(f for _, f in layout.files)}: put GLUE's {file} there")
        out[split] = (_read_tsv(name, path), path, None)
    return out


def _lines(path: str) -> Generator[tuple[int, str], None, None]:
    """(line number, line without its end) of a text file split at "\\n" only: no quote character, as
    GLUE's readers use csv with quoting=QUOTE_NONE, so a stray `"` or `\\r` stays inside its field.
    utf-8-sig: MRPC's train.tsv/dev.tsv keep the BOM of the file they were cut from."""
    try:
        with open(path, encoding="utf-8-sig", newline="\n") as f:
            for number, line in enumerate(f, 1):
                if line.endswith("\n"):
                    line = line[:-2] if line.endswith("\r\n") else line[:-1]
                yield number, line
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at a byte {exc.object[exc.start:exc.start + 1]!r}); "
                        f"GLUE's files are UTF-8: give the file as GLUE ships it") from None


def _read_tsv(name: str, path: str) -> list[dict]:
    """One GLUE file's rows, keyed by the Hub's field names, labels mapped to the Hub's indices."""
    if os.path.getsize(path) == 0:
        raise UserError(f"{path}: the file is empty; give GLUE's {_TSV[name].folder}/{os.path.basename(path)} "
                        f"with its rows")
    lines = _lines(path)
    try:
        return _parse(name, path, lines)
    finally:
        lines.close()


def _parse(name: str, path: str, lines: Iterator[tuple[int, str]]) -> list[dict]:
    spec, layout = GLUE[name], _TSV[name]
    file = os.path.basename(path)
    if layout.headerless:
        header = list(layout.columns)
    else:
        first = next(lines, None)
        header = first[1].split("\t") if first else []
        missing = [c for c in layout.columns if c not in header]
        if missing:
            raise UserError(f"{path}: line 1 is not GLUE's {layout.folder} header (no column "
                            f"{', '.join(repr(c) for c in missing)}; it has {', '.join(header)[:120]}); "
                            f"give GLUE's own {layout.folder}/{file}")
    col = {c: header.index(c) for c in (layout.text, layout.pair, layout.label) if c is not None}
    rows: list[dict] = []
    skipped: list[int] = []
    idx = 0
    for number, line in lines:
        if not line:
            continue  # a blank line (the end of a file): no row, as csv.DictReader reads it
        fields = line.split("\t")
        if len(fields) != len(header):
            if layout.skip_broken:
                skipped.append(number)
                idx += 1
                continue
            note = " (CoLA's train.tsv and dev.tsv have no header line)" if layout.headerless else ""
            raise UserError(f"{path}: line {number} has {len(fields)} tab-separated fields, GLUE's {file} has "
                            f"{len(header)} ({', '.join(header)[:120]}){note}; fix or drop the line")
        raw = fields[col[layout.label]].strip()
        if layout.values is None:
            try:
                label: Any = float(raw)
            except ValueError:
                label = None
            if label is None or not math.isfinite(label):
                raise UserError(f"{path}: line {number}: {layout.label} is {raw!r}, not a finite number; "
                                f"fix or drop the line")
        else:
            label = layout.values.get(raw)
            if label is None:
                raise UserError(f"{path}: line {number}: {layout.label} is {raw!r}, not one of GLUE's {name} labels "
                                f"({', '.join(layout.values)}); fix or drop the line")
        row = {spec.text_field: fields[col[layout.text]]}
        if spec.pair_field is not None:
            row[spec.pair_field] = fields[col[layout.pair]]
        row["label"] = label
        row["idx"] = idx
        idx += 1
        rows.append(row)
    if skipped:
        log.warning("%s: skipped %d line(s) without GLUE's %d fields (first: line %d), as GLUE's own readers do",
                    path, len(skipped), len(header), skipped[0])
    if not rows:
        raise UserError(f"{path}: no rows{'' if layout.headerless else ' after the header'}; "
                        f"give GLUE's {layout.folder}/{file} with its rows")
    return rows


# -- the Hub's files ----------------------------------------------------------------------------------

def _read_parquet_dir(name: str, where: str) -> dict[str, tuple[list[dict], str, Any]]:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    spec = GLUE[name]
    out = {}
    for split in _splits(name):
        hub = _hub_split(name, split)
        paths = _parquet_files(where, hub)
        if not paths:
            raise UserError(f"{where}: no {hub} file ({hub}-00000-of-00001.parquet); copy it from the Hub's "
                            f"{HUB_ID} {name}/ folder")
        tables = []
        for p in paths:
            try:
                tables.append(pq.read_table(p))
            except Exception as exc:
                raise UserError(f"{p}: not readable as parquet ({type(exc).__name__}); copy the file again "
                                f"from the Hub's {HUB_ID} {name}/ folder") from None
        try:
            table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        except Exception:
            raise UserError(f"{paths[1]}: its columns differ from {paths[0]}'s; the shards of one split "
                            f"must come from the same dataset") from None
        features = datasets.Features.from_arrow_schema(table.schema)
        out[split] = (_hub_rows(spec, table.to_pylist(), features, paths[0]), paths[0], features)
    return out


def _read_disk(name: str, where: str) -> dict[str, tuple[list[dict], str, Any]]:
    import datasets

    try:
        dd = datasets.load_from_disk(where)
    except Exception as exc:
        raise UserError(f"{where}: not readable by datasets.load_from_disk ({type(exc).__name__}); save it again "
                        f"with DatasetDict.save_to_disk") from None
    return _dataset_dict_rows(name, dd, where, f"save the Hub's {HUB_ID} {name} with all its splits")


def _dataset_dict_rows(name: str, dd: Any, where: str, fix: str) -> dict[str, tuple[list[dict], str, Any]]:
    """Each split of the task from a DatasetDict in the Hub's split names (loaded, or saved to disk)."""
    out = {}
    for split in _splits(name):
        hub = _hub_split(name, split)
        if hub not in dd:
            raise UserError(f"{where}: no split {hub!r} (it has {', '.join(dd)}); {fix}")
        ds = dd[hub]
        path = f"{where}/{hub}"
        out[split] = (_hub_rows(GLUE[name], ds.to_list(), ds.features, path), path, ds.features)
    return out


def _hub_rows(spec: GlueTask, rows: list[dict], features: Any, where: str) -> list[dict]:
    """Check the Hub's rows: its fields there, its ClassLabel the task's, every label a class index
    (a labelled split's -1 refused) or, for STS-B, a finite score."""
    fields = [spec.text_field, *([spec.pair_field] if spec.pair_field else []), "label"]
    have = list(features) if features is not None else list(rows[0]) if rows else []
    missing = [f for f in fields if f not in have]
    if missing:
        raise UserError(f"{where}: no field {missing[0]!r} (fields: {', '.join(map(str, have))}); this is not "
                        f"the Hub's {HUB_ID} {spec.name}: give that config's files")
    if not rows:
        raise UserError(f"{where}: the split has no rows; give the Hub's {HUB_ID} {spec.name} files")
    feat = features["label"] if features is not None else None
    names = list(getattr(feat, "names", None) or [])
    if names and names != spec.label_names:
        raise UserError(f"{where}: its label classes are {', '.join(names)}, not the Hub's {spec.name} classes "
                        f"({', '.join(spec.label_names)}); give the Hub's {HUB_ID} {spec.name} files")
    for i, r in enumerate(rows):
        value = r.get("label")
        if not KINDS[spec.kind].classes:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise UserError(f"{where}: row {i + 1}: label is {value!r}, not a finite score; fix or drop the row")
            r["label"] = float(value)
        elif isinstance(value, str) and value in spec.label_names:
            r["label"] = spec.label_names.index(value)
        elif isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(spec.label_names):
            hint = " (-1 marks an unlabelled test row: give train and validation files)" if value == -1 else ""
            raise UserError(f"{where}: row {i + 1}: label is {value!r}, not a class index 0 to "
                            f"{len(spec.label_names) - 1} ({', '.join(spec.label_names)}){hint}; fix or drop the row")
    return rows
