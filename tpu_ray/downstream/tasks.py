"""Labelled tasks for fine-tuning: where they come from, and the checks that refuse bad ones.

TASK is `builtin:stdlib-packages`, `glue/NAME`, a task YAML, or a directory of files named by split
(`train.*`, `validation.*`, as `datasets` names them; csv/tsv/jsonl/json/parquet, or a
`save_to_disk` directory). A token task's records are words and a label per word (fields `tokens`
and `tags` by default, as the `datasets` NER sets name them). Files are read with `datasets` (its
csv/json/parquet builders), the same library the corpus readers use. Every check runs here, before
any model is loaded: a bad task is one line naming the file, field or value, and exit code 2.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from tpu_ray.errors import UserError
from tpu_ray.downstream.builtin import builtin_rows
from tpu_ray.downstream.metrics import METRICS

BUILTIN_TASK = "builtin:stdlib-packages"
KINDS = ("classification", "regression", "tokens")
DEFAULT_METRICS = {"classification": ["accuracy", "macro_f1", "matthews"],
                   "regression": ["pearson", "spearman"], "tokens": ["entity_f1", "token_accuracy"]}
_FORMATS = {".csv": "csv", ".tsv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# GLUE's own field names and the metrics the papers report per task (GLUE paper, table 1).
GLUE = {
    "cola": ("sentence", None, "classification", ["matthews", "accuracy"]),
    "sst2": ("sentence", None, "classification", ["accuracy"]),
    "mrpc": ("sentence1", "sentence2", "classification", ["accuracy", "f1"]),
    "qqp": ("question1", "question2", "classification", ["accuracy", "f1"]),
    "stsb": ("sentence1", "sentence2", "regression", ["pearson", "spearman"]),
    "mnli": ("premise", "hypothesis", "classification", ["accuracy"]),
    "qnli": ("question", "sentence", "classification", ["accuracy"]),
    "rte": ("sentence1", "sentence2", "classification", ["accuracy"]),
    "wnli": ("sentence1", "sentence2", "classification", ["accuracy"]),
}
_GLUE_VALIDATION = {"mnli": "validation_matched"}


def builtin_task(rows: tuple[dict[str, list[dict]], list[str]] | None = None) -> Task:
    """The built-in task (tpu_ray.downstream.builtin's rows, or `rows` given) as a Task."""
    splits, labels = rows or builtin_rows()
    return Task(name=BUILTIN_TASK, kind="classification", splits=splits, label_names=labels,
                metrics=["accuracy", "macro_f1", "matthews"])


@dataclass
class Task:
    """A checked task: records {text, text_pair?, label} per split, labels as class indices
    (classification), floats (regression) or per-word class indices (tokens)."""

    name: str
    kind: str
    splits: dict[str, list[dict[str, Any]]]
    label_names: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)

    @property
    def has_pair(self) -> bool:
        return any(r.get("text_pair") is not None for r in self.splits["train"])

    def digest(self) -> str:
        """sha256 of the task's data as it is trained on: two runs compare only if it is equal."""
        body = json.dumps({"kind": self.kind, "labels": self.label_names,
                           "rows_by_split": {k: self.splits[k] for k in sorted(self.splits)}}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()

    def chance(self) -> float | None:
        """The accuracy of the best constant answer on validation (its largest class's share): what a
        model that ignores the text can reach at most, whichever class it learned to answer."""
        if self.kind != "classification":
            return None
        val = [r["label"] for r in self.splits["validation"]]
        return max(val.count(c) for c in set(val)) / len(val)

    def describe(self) -> str:
        sizes = ", ".join(f"{k} {len(v)}" for k, v in self.splits.items())
        classes = f", {len(self.label_names)} classes" if self.label_names else ""
        chance = self.chance()
        return f"{self.name}: {self.kind}{classes}; {sizes}" + (f"; chance {chance:.3f}" if chance is not None else "")


def load_task(spec: str) -> Task:
    """The task named by `spec` (see the module docstring), checked."""
    if not spec or not spec.strip():
        raise UserError("--task is empty; give builtin:stdlib-packages, glue/NAME, a task YAML or a directory")
    if spec.startswith("builtin:"):
        if spec != BUILTIN_TASK:
            raise UserError(f"--task {spec}: unknown built-in task; the built-in one is {BUILTIN_TASK}")
        return builtin_task()
    if spec.startswith("glue/"):
        return _glue(spec[len("glue/"):], None, spec)
    if spec.endswith((".yaml", ".yml")):
        return _from_yaml(spec)
    if os.path.isdir(spec):
        return _from_files(spec, _split_files(spec), {}, spec)
    raise UserError(f"--task {spec}: not found; give {BUILTIN_TASK}, glue/NAME, a task YAML or a directory "
                    f"with train.* and validation.* files")


def _from_yaml(path: str) -> Task:
    import yaml

    if not os.path.isfile(path):
        raise UserError(f"--task {path}: no such task YAML")
    try:
        doc = yaml.safe_load(open(path, encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: a task YAML is a mapping (data:, text_field:, label_field:, ...), "
                        f"got {type(doc).__name__}")
    known = {"name", "data", "glue", "kind", "text_field", "pair_field", "label_field", "label_names", "metrics",
             "train", "validation"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise UserError(f"{path}: unknown key {unknown[0]!r}; a task YAML takes {', '.join(sorted(known))}")
    base = os.path.dirname(os.path.abspath(path))
    where = lambda p: p if os.path.isabs(p) else os.path.join(base, p)  # noqa: E731 - relative to the YAML
    if doc.get("glue"):
        return _glue(str(doc["glue"]), where(str(doc["data"])) if doc.get("data") else None, path)
    if doc.get("train") or doc.get("validation"):
        files = {s: sorted(glob.glob(where(str(doc[s])))) for s in ("train", "validation") if doc.get(s)}
    elif doc.get("data"):
        files = _split_files(where(str(doc["data"])))
    else:
        raise UserError(f"{path}: name the data: data: DIR (train.*, validation.*) or train: FILE and "
                        f"validation: FILE")
    return _from_files(str(doc.get("name") or path), files, doc, path)


def _glue(name: str, data: str | None, where: str) -> Task:
    if name not in GLUE:
        raise UserError(f"{where}: unknown GLUE task {name!r}; one of {', '.join(GLUE)}")
    text, pair, kind, metrics = GLUE[name]
    opts = {"text_field": text, "pair_field": pair, "label_field": "label", "kind": kind, "metrics": metrics}
    if data is not None:  # the task's files as GLUE ships them, or a local copy of the Hub's parquet
        return _from_files(f"glue/{name}", _split_files(data, _GLUE_VALIDATION.get(name, "validation")), opts, data)
    import datasets

    try:
        ds = datasets.load_dataset("nyu-mll/glue", name)
    except Exception as exc:  # offline, no cache: say how to give the files instead
        raise UserError(f"glue/{name}: could not load it from the Hub ({type(exc).__name__}); download it once, "
                        f"or give a task YAML with glue: {name} and data: DIR (train.*, validation.*)") from None
    splits = {"train": ds["train"], "validation": ds[_GLUE_VALIDATION.get(name, "validation")]}
    return _check(f"glue/{name}", {s: (d.to_list(), f"glue/{name}:{s}", d.features) for s, d in splits.items()},
                  opts)


def _split_files(data: str, validation: str = "validation") -> dict[str, list[str]]:
    """A directory's files by split (`train.*`, `validation.*`; `dev.*` as GLUE names it)."""
    if not os.path.isdir(data):
        raise UserError(f"{data}: not a directory; a task's data is a directory with train.* and validation.* files")
    if os.path.exists(os.path.join(data, "dataset_dict.json")):  # datasets' save_to_disk
        return {"train": [os.path.join(data, "train")], "validation": [os.path.join(data, validation)]}
    files: dict[str, list[str]] = {}
    for split, names in (("train", ("train",)), ("validation", (validation, "validation", "dev"))):
        for stem in names:
            found = sorted(p for p in glob.glob(os.path.join(data, stem + ".*")) if _fmt(p, quiet=True))
            if found:
                files[split] = found
                break
    return files


def _fmt(path: str, quiet: bool = False) -> str | None:
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "state.json")):
        return "disk"
    ext = os.path.splitext(path)[1].lower()
    if ext not in _FORMATS and not quiet:
        raise UserError(f"{path}: unknown task file type {ext!r}; use .csv, .tsv, .jsonl, .json or .parquet")
    return _FORMATS.get(ext)


def _read(paths: list[str]) -> tuple[list[dict], Any]:
    """Rows and `datasets` features of one split's files, through datasets' own builders."""
    import datasets

    datasets.disable_progress_bars()
    fmt = _fmt(paths[0])
    empty = [p for p in paths if os.path.isfile(p) and os.path.getsize(p) == 0]
    if empty:
        raise UserError(f"{empty[0]}: the file is empty, so its split has no rows; give it labelled rows")
    if fmt == "disk":
        ds = datasets.load_from_disk(paths[0])
        return ds.to_list(), ds.features
    kwargs = {"delimiter": "\t"} if paths[0].lower().endswith(".tsv") else {}
    try:
        ds = datasets.load_dataset(fmt, data_files={"x": paths}, split="x", **kwargs)
    except Exception as exc:
        raise UserError(f"{paths[0]}: not readable as {fmt} ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); check the file's shape") from None
    return ds.to_list(), ds.features


def _from_files(name: str, files: dict[str, list[str]], opts: dict, where: str) -> Task:
    for split in ("train", "validation"):
        if not files.get(split):
            raise UserError(f"{where}: no {split} file; name it {split}.csv/.tsv/.jsonl/.parquet "
                            f"(or give {split}: FILE in a task YAML)")
    raw = {}
    for split, paths in files.items():
        rows, features = _read(paths)
        raw[split] = (rows, paths[0], features)
    return _check(name, raw, opts)


def _check(name: str, raw: dict[str, tuple[list[dict], str, Any]], opts: dict) -> Task:
    """Map raw rows to records, refusing what training would trip on later or silently mislearn."""
    kind = opts.get("kind")
    if kind is not None and kind not in KINDS:
        raise UserError(f"{name}: kind={kind!r}; one of {', '.join(KINDS)}")
    first_row = raw["train"][0][0] if raw.get("train") and raw["train"][0] else {}
    # A token task's fields default to `tokens` and `tags`, as the `datasets` NER sets (CoNLL-2003,
    # WikiANN) name them (`text` and `label` where a file has those and not the others); a file whose
    # text field holds a list of words is a token task.
    given_text = opts.get("text_field")
    words = kind == "tokens" or (kind is None and isinstance(
        first_row.get(given_text or ("text" if "text" in first_row else "tokens")), list))
    text_f = str(given_text or ("tokens" if words and "text" not in first_row else "text"))
    pair_f = None if words else opts.get("pair_field", "text_pair")
    label_f = str(opts.get("label_field") or ("tags" if words and ("tags" in first_row or "label" not in first_row)
                                              else "label"))
    rows: dict[str, list[dict]] = {}
    for split, (data, path, _features) in raw.items():
        if not data:
            raise UserError(f"{path}: split {split!r} has no rows; give it labelled rows")
        for f_ in (text_f, label_f):
            if f_ not in data[0]:
                raise UserError(f"{path}: no field {f_!r} (fields: {', '.join(map(str, data[0]))}); name the right one "
                                f"with {'text' if f_ == text_f else 'label'}_field: in a task YAML")
        rows[split] = data
    first = rows["train"][0]
    use_pair = bool(pair_f) and pair_f in first
    kind = kind or _infer_kind(rows["train"], text_f, label_f)
    metrics = list(opts.get("metrics") or DEFAULT_METRICS[kind])

    for m in metrics:
        if m not in METRICS:
            raise UserError(f"{name}: unknown metric {m!r}; one of {', '.join(METRICS)}")
    names = _label_names(raw["train"][2], label_f, rows["train"], kind)
    given = opts.get("label_names")
    if given is not None:  # integer labels named by the task config (a NER set's ClassLabel names lost in a file)
        if not isinstance(given, list) or not given or len(set(map(str, given))) != len(given):
            raise UserError(f"{name}: label_names={_show(given)}; give a list of distinct class names, "
                            f"index i naming label i")
        names = [str(n) for n in given]
    out: dict[str, list[dict]] = {}
    for split, data in rows.items():
        path = raw[split][1]
        recs = []
        for i, r in enumerate(data):
            text = r.get(text_f)
            want = list if kind == "tokens" else str
            if not isinstance(text, want) or not text or (kind == "tokens" and not all(
                    isinstance(w, str) and w for w in text)):
                raise UserError(f"{path}: row {i + 1}: field {text_f!r} is {_show(text)}; each row needs "
                                f"{'a list of words (non-empty strings)' if kind == 'tokens' else 'a text'}")
            rec: dict[str, Any] = {"text": text}
            if use_pair:
                pair = r.get(pair_f)
                if not isinstance(pair, str) or not pair:
                    raise UserError(f"{path}: row {i + 1}: pair field {pair_f!r} is {_show(pair)}; every row of a "
                                    f"pair task needs both texts (drop the row, or set pair_field: null)")
                rec["text_pair"] = pair
            rec["label"] = _label(r.get(label_f), kind, names, f"{path}: row {i + 1}: {label_f!r}", len(text))
            recs.append(rec)
        out[split] = recs
    seen = {v for r in out["train"] for v in (r["label"] if kind == "tokens" else [r["label"]])}
    if kind in ("classification", "tokens") and len(seen) < 2:
        raise UserError(f"{raw['train'][1]}: field {label_f!r} has one class only ({names[next(iter(seen))]!r}); "
                        f"a classifier needs at least two")
    return Task(name=name, kind=kind, splits=out, label_names=names, metrics=metrics)


def _infer_kind(rows: list[dict], text_f: str, label_f: str) -> str:
    if isinstance(rows[0].get(text_f), list):
        return "tokens"
    labels = [r.get(label_f) for r in rows]
    if all(isinstance(v, float) for v in labels) and any(not float(v).is_integer() for v in labels
                                                         if math.isfinite(v)):
        return "regression"
    return "classification"


def _label_names(features: Any, label_f: str, train: list[dict], kind: str) -> list[str]:
    """Class names: the ClassLabel's names when the data carries them, else train's values sorted."""
    if kind == "regression":
        return []
    feat = features[label_f] if features is not None and label_f in features else None
    feat = getattr(feat, "feature", feat)  # a Sequence(ClassLabel) for tokens
    if getattr(feat, "names", None):
        return list(feat.names)
    values = {v for r in train for v in (r.get(label_f) if kind == "tokens" else [r.get(label_f)])
              if isinstance(v, (str, int)) and not isinstance(v, bool)}
    return [str(v) for v in sorted(values, key=lambda v: (isinstance(v, str), v))]


def _label(value: Any, kind: str, names: list[str], where: str, n_words: int) -> Any:
    if kind == "regression":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UserError(f"{where} is {_show(value)}; a regression target must be a finite number")
        return float(value)
    if kind == "tokens":
        if not isinstance(value, list):
            raise UserError(f"{where} is {_show(value)}; a token task needs a list of labels, one per word")
        if len(value) != n_words:
            raise UserError(f"{where} has {len(value)} labels for {n_words} words; a token task needs one label "
                            f"per word (fix the row so the two lists have the same length)")
        return [_class(v, names, where) for v in value]
    return _class(value, names, where)


def _class(value: Any, names: list[str], where: str) -> int:
    key = str(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names) and key not in names:
        return value  # an index into ClassLabel names
    if value is None or key not in names:
        raise UserError(f"{where} is {_show(value)}, a label the train split never had "
                        f"(train has {', '.join(names[:10])}); fix the row or add the class to train")
    return names.index(key)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
