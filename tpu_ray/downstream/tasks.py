"""Labelled tasks for fine-tuning: where they come from, and the checks that refuse bad ones.

TASK is `builtin:stdlib-packages`, `glue/NAME`, a task YAML, or a directory of files named by split
(`train.*`, `validation.*`, as `datasets` names them; csv/tsv/jsonl/json/parquet, or a
`save_to_disk` directory). A token task's records are words and a label per word (fields `tokens`
and `tags` by default, as the `datasets` NER sets name them). Files are read with `datasets` (its
csv/json/parquet builders), the same library the corpus readers use. Every check runs here, before
any model is loaded: a bad task is one line naming the file, field or value, and exit code 2.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import json
import math
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any

from tpu_ray.errors import UserError
from tpu_ray.downstream.builtin import builtin_rows
from tpu_ray.downstream import glue
from tpu_ray.downstream.kinds import KINDS, TaskKind, show as _show, whole as _whole
from tpu_ray.downstream.metrics import METRICS

log = logging.getLogger("tpu_ray.downstream")
BUILTIN_TASK = "builtin:stdlib-packages"
DEFAULT_METRICS = {name: list(k.metrics) for name, k in KINDS.items()}
_FORMATS = {".csv": "csv", ".tsv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


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
    _digest: str | None = field(default=None, repr=False, compare=False)

    @property
    def kind_obj(self) -> TaskKind:
        """The kind's behaviour: its head, encoding and predictions (kinds.py)."""
        return KINDS[self.kind]

    @property
    def has_pair(self) -> bool:
        return any(r.get("text_pair") is not None for r in self.splits["train"])

    @property
    def eval_splits(self) -> list[str]:
        """Every labelled split scored after each epoch: validation (where the learning rate and the
        epoch are chosen), test where the task has one, and a task's extra ones (MNLI's mismatched)."""
        return [s for s in self.splits if s != "train"]

    @property
    def report_split(self) -> str:
        """The split whose score is reported: test where the task has a labelled one (held out from
        every choice), else validation (the selection split: an optimistic figure, named so)."""
        return "test" if "test" in self.splits else "validation"

    def train_rows(self, limit: int = 0) -> list[dict[str, Any]]:
        """Train, or a sample of `limit` rows of it drawn with a fixed seed (the same for every trial),
        never the first rows: a file sorted by label would give one class."""
        rows = self.splits["train"]
        if not limit or limit >= len(rows):
            return rows
        import random

        return [rows[i] for i in sorted(random.Random(0).sample(range(len(rows)), limit))]

    def digest(self) -> str:
        """sha256 of the task as it is trained and scored (data, classes, metrics): two runs compare only
        if it is equal, and a changed `metrics:` never reuses trials recorded without the new headline."""
        if self._digest is None:  # once: an MNLI-sized task takes seconds, and every record is checked with it
            body = json.dumps({"kind": self.kind, "labels": self.label_names, "metrics": self.metrics,
                               "rows_by_split": {k: self.splits[k] for k in sorted(self.splits)}}, sort_keys=True)
            self._digest = hashlib.sha256(body.encode()).hexdigest()
        return self._digest

    def chance(self, split: str | None = None) -> float | None:
        """The accuracy of the best constant answer on `split` (the reported one by default): its
        largest class's share, what a model that ignores the text can reach at most. Only where the
        headline metric is accuracy: a constant answer scores 0 in Matthews correlation and F1 differs."""
        if not self.kind_obj.classes or self.metrics[:1] != ["accuracy"]:
            return None
        val = [r["label"] for r in self.splits[split or self.report_split]]
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
             "positive_label", "train", "validation", "test"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise UserError(f"{path}: unknown key {unknown[0]!r}; a task YAML takes {', '.join(sorted(known))}")
    base = os.path.dirname(os.path.abspath(path))
    where = lambda p: p if os.path.isabs(p) else os.path.join(base, p)  # noqa: E731 - relative to the YAML
    if doc.get("glue"):
        ignored = sorted(set(doc) - {"name", "glue", "data"})
        if ignored:
            raise UserError(f"{path}: {ignored[0]!r} with glue: GLUE's tasks have their fields, classes and official "
                            f"metrics built in; drop the key, or describe the data without glue: to choose them")
        return _glue(str(doc["glue"]), where(str(doc["data"])) if doc.get("data") else None, path)
    if doc.get("train") or doc.get("validation"):
        files = {s: sorted(glob.glob(where(str(doc[s])))) for s in ("train", "validation", "test") if doc.get(s)}
        missing = [s for s in ("test",) if doc.get(s) and not files[s]]
        if missing:
            raise UserError(f"{path}: test: {doc['test']} matches no file; fix the path or drop the key")
    elif doc.get("data"):
        files = _split_files(where(str(doc["data"])))
    else:
        raise UserError(f"{path}: name the data: data: DIR (train.*, validation.*) or train: FILE and "
                        f"validation: FILE")
    return _from_files(str(doc.get("name") or path), files, doc, path)


def _glue(name: str, data: str | None, where: str) -> Task:
    """A GLUE task: its files as GLUE distributes them (or a local copy of the Hub's), else the Hub."""
    if name not in glue.GLUE:
        raise UserError(f"{where}: unknown GLUE task {name!r}; one of {', '.join(glue.GLUE)}")
    spec = glue.GLUE[name]
    raw = glue.read_glue_dir(name, data) if data is not None else glue.load_glue_hub(name)
    # GLUE keeps QQP's two rows whose second question is empty, as the Hub and run_glue.py do
    opts = {"text_field": spec.text_field, "pair_field": spec.pair_field, "label_field": "label", "kind": spec.kind,
            "empty_pair_ok": True,
            "metrics": list(spec.metrics), "label_names": list(spec.label_names) or None}
    return _check(f"glue/{name}", raw, opts)


def _split_files(data: str) -> dict[str, list[str]]:
    """A directory's files by split: `train.*`, `validation.*` (`dev.*` as GLUE names it) and, where
    there is one, `test.*` (scored, never used to choose)."""
    if not os.path.isdir(data):
        raise UserError(f"{data}: not a directory; a task's data is a directory with train.* and validation.* files")
    if os.path.exists(os.path.join(data, "dataset_dict.json")):  # datasets' save_to_disk
        return {s: [os.path.join(data, s)] for s in ("train", "validation", "test")
                if os.path.isdir(os.path.join(data, s))}
    files: dict[str, list[str]] = {}
    for split, names in (("train", ("train",)), ("validation", ("validation", "dev")), ("test", ("test",))):
        for stem in names:
            found = [os.path.join(data, stem + ext) for ext in _FORMATS if os.path.isfile(os.path.join(data, stem + ext))]
            if len(found) > 1:
                raise UserError(f"{data}: {len(found)} {split} files ({', '.join(map(os.path.basename, found))}); "
                                f"keep one, or name each file in a task YAML ({split}: FILE)")
            if found:
                files[split] = found
                others = sorted(os.path.basename(p) for p in glob.glob(os.path.join(data, stem + ".*"))
                                if p not in found and _fmt(p, quiet=True))
                if others:  # train.small.csv beside train.csv: never read into train by a glob
                    log.warning("%s: %s not read (the %s split is %s)", data, ", ".join(others), split,
                                os.path.basename(found[0]))
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
    # A TSV has no quoting (IANA's text/tab-separated-values): a '"' in a text is text. Read with the
    # csv builder's default quoting, one stray quote would open a field that swallows the rows after it.
    tsv = paths[0].lower().endswith(".tsv")
    kwargs = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if tsv else {}
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
    if kind is not None and kind not in KINDS:  # a kind is a class in kinds.py and its KINDS entry
        raise UserError(f"{name}: kind={kind!r}; one of {', '.join(KINDS)}")
    first_row = raw["train"][0][0] if raw.get("train") and raw["train"][0] else {}
    # A token task's fields default to `tokens` and `tags`, as the `datasets` NER sets (CoNLL-2003,
    # WikiANN) name them (`text` and `label` where a file has those and not the others); a file whose
    # text field holds a list of words is a token task.
    given_text = opts.get("text_field")
    words = (kind is not None and KINDS[kind].words) or (kind is None and isinstance(
        first_row.get(given_text or ("text" if "text" in first_row else "tokens")), list))
    text_f = str(given_text or ("tokens" if words and "text" not in first_row else "text"))
    pair_f = None if words else opts.get("pair_field", "text_pair")  # a word task (tokens) has no pairs
    label_f = str(opts.get("label_field") or ("tags" if words and ("tags" in first_row or "label" not in first_row)
                                              else "label"))
    if text_f == label_f:
        raise UserError(f"{name}: text_field and label_field are both {text_f!r}: the label would be in the text; "
                        f"name two fields")
    raw = _labelled_test_only(raw, label_f)
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
    handler = KINDS[kind]
    metrics = list(opts.get("metrics") or handler.metrics)

    for m in metrics:
        if m not in METRICS:
            raise UserError(f"{name}: unknown metric {m!r}; one of {', '.join(METRICS)}")
        if m not in handler.allowed:
            raise UserError(f"{name}: metric {m!r} does not score a {kind} task; it takes {', '.join(handler.allowed)}")
    names, indexed = _label_names(raw["train"][2], label_f, rows["train"], handler)
    given = opts.get("label_names")
    if given is not None:  # integer labels named by the task config (a NER set's ClassLabel names lost in a file)
        if not isinstance(given, list) or not given or len(set(map(str, given))) != len(given):
            raise UserError(f"{name}: label_names={_show(given)}; give a list of distinct class names, "
                            f"index i naming label i")
        names, indexed = [str(n) for n in given], True
    # A split saved with its own ClassLabel (names=sorted(set(its labels))) numbers the classes its own
    # way: its integers are read through its names, then matched to train's by name, never by number.
    split_names = {split: own for split in rows if split != "train"
                   if (own := _label_names(raw[split][2], label_f, rows[split], handler))[1] and own[0] != names}
    split_names = {split: own[0] for split, own in split_names.items()}
    _check_label_strings(rows, raw, label_f, handler)
    out: dict[str, list[dict]] = {}
    for split, data in rows.items():
        path = raw[split][1]
        recs = []
        for i, r in enumerate(data):
            text = r.get(text_f)
            if not handler.text_ok(text) or (isinstance(text, str) and not text.strip()):
                raise UserError(f"{path}: row {i + 1}: field {text_f!r} is {_show(text)}; each row needs "
                                f"{handler.text_wanted}")
            rec: dict[str, Any] = {"text": text}
            if use_pair:
                pair = r.get(pair_f)
                if not isinstance(pair, str) or (not pair and not opts.get("empty_pair_ok")):
                    raise UserError(f"{path}: row {i + 1}: pair field {pair_f!r} is {_show(pair)}; every row of a "
                                    f"pair task needs both texts (drop the row, or set pair_field: null)")
                rec["text_pair"] = pair
            where = f"{path}: row {i + 1}: {label_f!r}"
            value = _by_train_names(r.get(label_f), split_names.get(split), where)
            rec["label"] = handler.label(value, names, indexed, where, len(text))
            recs.append(rec)
        out[split] = recs
    if "f1" in metrics:
        names, out = _positive_class(name, names, indexed, opts.get("positive_label"), out)
    elif opts.get("positive_label") is not None:
        raise UserError(f"{name}: positive_label is read by metrics: [f1] only (binary F1's positive class); "
                        f"drop it, or score f1")
    seen = _classes(out["train"], handler)
    if handler.classes and len(seen) < 2:
        raise UserError(f"{raw['train'][1]}: field {label_f!r} has one class only ({names[next(iter(seen))]!r}); "
                        f"a classifier needs at least two")
    if "entity_f1" in metrics and not any(_IOB_TAG.match(n) for n in names):
        raise UserError(f"{raw['train'][1]}: the tags are {_show(names)}, with no IOB name (B-X, I-X, O), so entity "
                        f"F1 would find no entity and score 0; name them with label_names: [O, B-PER, I-PER, ...] "
                        f"in a task YAML (index i naming tag i), or score metrics: [token_accuracy]")
    for split in out:  # a class the model never saw trained, scored as missed: refused, by value
        unseen = sorted(_classes(out[split], handler) - seen)
        if unseen:
            row = next(i for i, r in enumerate(out[split]) if set(_classes([r], handler)) & set(unseen))
            raise UserError(f"{raw[split][1]}: row {row + 1}: {label_f!r} is {names[unseen[0]]!r}, a label the train "
                            f"split never had (train has {', '.join(names[c] for c in sorted(seen))[:200]}); fix the "
                            f"row or add the class to train")
    if handler.classes:
        _check_scored_classes(name, out, raw, handler, names, metrics)
    _warn_overlap(out, raw)
    return Task(name=name, kind=kind, splits=out, label_names=names, metrics=metrics)


def _by_train_names(value: Any, own: list[str] | None, where: str) -> Any:
    """An integer label of a split with its own ClassLabel names, as its class name (lists elementwise)."""
    if own is None:
        return value
    if isinstance(value, list):
        return [_by_train_names(v, own, where) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < len(own):
            raise UserError(f"{where} is {value}, not one of its split's {len(own)} named classes ({', '.join(own[:10])})")
        return own[value]
    return value


def _check_label_strings(rows: dict[str, list[dict]], raw: dict, label_f: str, handler: TaskKind) -> None:
    """A label that is empty or carries spaces at its ends, or two spellings of one name (Unicode NFC vs
    NFD), would be a class of its own: refused, naming the row."""
    import unicodedata

    if not handler.classes:
        return
    for split, data in rows.items():
        for i, r in enumerate(data):
            for v in handler.label_values(r.get(label_f)):
                if isinstance(v, str) and (not v.strip() or v != v.strip() or unicodedata.normalize("NFC", v) != v):
                    why = ("is empty" if not v.strip() else "has spaces at its ends" if v != v.strip()
                           else "is not in Unicode NFC form (another spelling of the same name would be another class)")
                    raise UserError(f"{raw[split][1]}: row {i + 1}: {label_f!r} is {_show(v)}, which {why}; fix the label")


# Metrics that a split with one gold class makes constant (or undefined): selecting on them chooses nothing.
_NEED_TWO_CLASSES = ("accuracy", "f1", "macro_f1", "matthews", "entity_f1", "token_accuracy")


def _check_scored_classes(name: str, out: dict[str, list[dict]], raw: dict, handler: TaskKind, names: list[str],
                          metrics: list[str]) -> None:
    """Validation chooses the learning rate and the epoch: with one gold class (or, for f1, no positive
    one) every model scores alike there and the choice is a constant. Refused for validation; a test
    split with one class is reported with a warning (its score still means something, its chance is 1)."""
    for split in ("validation", "test"):
        if split not in out:
            continue
        classes = _classes(out[split], handler)
        problem = None
        if len(classes) < 2:
            problem = f"has one class only ({names[next(iter(classes))]!r})"
        elif "f1" in metrics and 1 not in classes:
            problem = f"has no row of the positive class {names[1]!r}, so its F1 is 0 for every model"
        if problem is None:
            continue
        if split == "validation":
            raise UserError(f"{raw[split][1]}: the validation split {problem}; the learning rate and epoch chosen on "
                            f"it would be a constant; give validation rows of every class")
        log.warning("%s: the test split %s; its score is reported, but says little", raw[split][1], problem)


def _warn_overlap(out: dict[str, list[dict]], raw: dict) -> None:
    """Rows of validation or test that are also in train (the same text and pair): a score on them
    measures memory. Refused when a split is train itself; otherwise counted and warned (some published
    sets overlap by design, e.g. GLUE's QQP)."""
    train = {(r["text"] if isinstance(r["text"], str) else tuple(r["text"]), r.get("text_pair")) for r in out["train"]}
    for split, recs in out.items():
        if split == "train":
            continue
        keys = [(r["text"] if isinstance(r["text"], str) else tuple(r["text"]), r.get("text_pair")) for r in recs]
        same = sum(k in train for k in keys)
        if same == len(keys) and len(set(keys)) == len(train):
            raise UserError(f"{raw[split][1]}: the {split} split is the train split's rows; its score would measure "
                            f"memory; give held-out rows")
        if same:
            log.warning("%s: %d of %d %s rows are also in train (the same text); their score measures memory",
                        raw[split][1], same, len(keys), split)


def _positive_class(name: str, names: list[str], indexed: bool, positive: Any,
                    out: dict[str, list[dict]]) -> tuple[list[str], dict[str, list[dict]]]:
    """metrics: [f1] is binary F1 of the class numbered 1: refused unless the task has two classes and
    says which is positive (named classes, as GLUE's MRPC and QQP, number it 1; else positive_label:).
    Labels read by value (strings) are numbered in sorted order, so 1 would be whichever sorts second."""
    if len(names) != 2:  # a kind whose metrics include f1 has named classes (kinds.py)
        raise UserError(f"{name}: metrics: [f1] is binary F1, for two classes; this task has {len(names)} classes; "
                        f"score macro_f1 instead")
    if positive is None:
        if indexed:
            return names, out
        raise UserError(f"{name}: metrics: [f1] scores one class as the positive one and the labels "
                        f"{_show(names)} do not say which; add positive_label: {names[1]} (or {names[0]}) to the task YAML")
    if str(positive) not in names:
        quote = " (YAML reads yes/no/true/false unquoted as a boolean: quote it)" if isinstance(positive, bool) else ""
        raise UserError(f"{name}: positive_label={positive!r} is not a class of this task ({', '.join(names)}){quote}")
    if names.index(str(positive)) == 1:
        return names, out
    swapped = {split: [{**r, "label": 1 - r["label"]} for r in recs] for split, recs in out.items()}
    return [names[1], names[0]], swapped


_IOB_TAG = re.compile(r"^[BIESLU]-.")  # seqeval's schemes (IOB1/2, IOE, IOBES, BILOU) name an entity's tags so


def _classes(records: list[dict], kind: TaskKind) -> set[int]:
    return {v for r in records for v in kind.class_ids(r["label"])}


def _labelled_test_only(raw: dict[str, tuple[list[dict], str, Any]], label_f: str) -> dict:
    """Drop a test split that carries no labels (the field absent, or every label -1 as the Hub's GLUE
    and many Hub sets ship test), saying so; a test split with some labels goes on to be checked."""
    test = raw.get("test")
    if test is None or not test[0]:
        return {k: v for k, v in raw.items() if k != "test"}
    labels = [r.get(label_f) for r in test[0]]
    if all(v is None or v == -1 for v in labels):
        log.warning("%s: the test split has no labels (%s); scores are reported on validation", test[1],
                    "every label is -1" if label_f in test[0][0] else f"no field {label_f!r}")
        return {k: v for k, v in raw.items() if k != "test"}
    return raw


def _infer_kind(rows: list[dict], text_f: str, label_f: str) -> str:
    if isinstance(rows[0].get(text_f), list):
        return "tokens"
    labels = [r.get(label_f) for r in rows]
    if all(isinstance(v, float) for v in labels) and any(not float(v).is_integer() for v in labels
                                                         if math.isfinite(v)):
        return "regression"
    return "classification"


def _label_names(features: Any, label_f: str, train: list[dict], kind: TaskKind) -> tuple[list[str], bool]:
    """(class names, indexed): the ClassLabel's names when the data carries them (an integer label is
    then an index into them), else train's values sorted (every label is then mapped by its value)."""
    if not kind.classes:
        return [], False
    feat = features[label_f] if features is not None and label_f in features else None
    feat = getattr(feat, "feature", feat)  # a Sequence(ClassLabel) for tokens
    if getattr(feat, "names", None):
        return list(feat.names), True
    values = {_whole(v) for r in train for v in kind.label_values(r.get(label_f)) if isinstance(_whole(v), (str, int))}
    return [str(v) for v in sorted(values, key=lambda v: (isinstance(v, str), v))], False


