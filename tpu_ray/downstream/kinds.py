"""Kinds of downstream task as objects: what a row's text and label hold, the model head, how rows
are encoded and how logits become predictions. A new kind is one class here and an entry in KINDS;
the task checks (tasks.py) and the trial (finetune.py) ask the kind and never test its name.

Why not transformers' pipelines or Trainer: they cover inference and a PyTorch training loop; the
pieces a kind needs here (a TF head, encoding to static shapes, reading predictions back per word)
are small and specific to how a trial scores every split after each epoch.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from tpu_ray.downstream import tokens
from tpu_ray.errors import UserError


def whole(value: Any) -> Any:
    """1.0 -> 1: a label column with a missing value reads as floats; its classes are still 0, 1, ...
    A JSON true/false is a class named "True"/"False" (never the index 1/0)."""
    if isinstance(value, bool):
        return str(value)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def class_index(value: Any, names: list[str], indexed: bool, where: str) -> int:
    """A label's class index. With named classes (a ClassLabel, or label_names:) an integer is an index
    into the names; otherwise every label is mapped by its value, whatever its type, so train's 1, 2, 4, 5
    are four classes and a 3 in validation is refused, never read as an index."""
    value = whole(value)
    if isinstance(value, int) and not isinstance(value, bool) and indexed:
        if 0 <= value < len(names):
            return value
        raise UserError(f"{where} is {value}, not one of the {len(names)} named classes (0 to {len(names) - 1}: "
                        f"{', '.join(names[:10])}); fix the row or the label names")
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value) in names:
        return names.index(str(value))
    raise UserError(f"{where} is {show(value)}, a label the train split never had "
                    f"(train has {', '.join(names[:10])}); fix the row or add the class to train")


def encode_texts(tok: Any, rows: list[dict], pair: bool, max_length: int, type_vocab: int) -> dict[str, Any]:
    """Texts (and pairs) as fixed-length model inputs: static shapes, one compiled program."""
    enc = tok([r["text"] for r in rows], [r["text_pair"] for r in rows] if pair else None, truncation=True,
              max_length=max_length, padding="max_length", return_tensors="np")
    keep = ["input_ids", "attention_mask"] + (["token_type_ids"] if type_vocab > 1 else [])
    return {k: enc[k] for k in keep if k in enc}


class TaskKind:
    """One kind of task. `classes`: its labels are named classes (else numbers); `words`: a row's text
    is a list of words, with a label each (else a text, maybe with a pair); `metrics`: reported by
    default, the headline first; `allowed`: every metric that means something for it."""

    name: ClassVar[str]
    metrics: ClassVar[list[str]]
    allowed: ClassVar[tuple[str, ...]]
    classes: ClassVar[bool] = True
    words: ClassVar[bool] = False
    text_wanted: ClassVar[str] = "a text"

    def text_ok(self, text: Any) -> bool:
        return isinstance(text, str) and bool(text)

    def label(self, value: Any, names: list[str], indexed: bool, where: str, n_words: int) -> Any:
        return class_index(value, names, indexed, where)

    def label_values(self, label: Any) -> list[Any]:
        """The raw class values one row's label holds (for the class names read from train)."""
        return [label]

    def class_ids(self, label: Any) -> list[int]:
        """The class indices one checked label holds (for the classes train has and the others lack)."""
        return [label] if self.classes else []

    def head(self, label_names: list[str]) -> dict[str, Any]:
        """The model config's head settings (num_labels, problem_type, the label names)."""
        return {"num_labels": len(label_names), "id2label": dict(enumerate(label_names)),
                "label2id": {n: i for i, n in enumerate(label_names)}}

    def model_class(self) -> Any:
        from transformers import TFAutoModelForSequenceClassification

        return TFAutoModelForSequenceClassification

    def encode(self, tok: Any, rows: list[dict], pair: bool, length: int,
               type_vocab: int) -> tuple[dict[str, Any], np.ndarray, Any]:
        """(model inputs, training targets, what predictions() needs besides logits)."""
        return encode_texts(tok, rows, pair, length, type_vocab), np.asarray([r["label"] for r in rows], np.int32), None

    def predictions(self, logits: np.ndarray, rows: list[dict], extra: Any,
                    label_names: list[str]) -> tuple[list, list]:
        """(gold, predicted) as the metrics read them."""
        return [r["label"] for r in rows], logits.argmax(-1).tolist()

    def token_counts(self, tok: Any, rows: list[dict], pair: bool) -> list[int]:
        """Each row's length in tokens, uncut (the share max_length truncates)."""
        enc = tok([r["text"] for r in rows], [r["text_pair"] for r in rows] if pair else None, truncation=False)
        return [len(ids) for ids in enc["input_ids"]]


class Classification(TaskKind):
    name = "classification"
    metrics = ["accuracy", "macro_f1", "matthews"]
    allowed = ("accuracy", "f1", "macro_f1", "matthews")

    def head(self, label_names: list[str]) -> dict[str, Any]:
        return {**super().head(label_names), "problem_type": "single_label_classification"}


class Regression(TaskKind):
    name = "regression"
    metrics = ["pearson", "spearman"]
    allowed = ("pearson", "spearman")
    classes = False

    def label(self, value: Any, names: list[str], indexed: bool, where: str, n_words: int) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UserError(f"{where} is {show(value)}; a regression target must be a finite number")
        return float(value)

    def label_values(self, label: Any) -> list[Any]:
        return []

    def head(self, label_names: list[str]) -> dict[str, Any]:
        return {"num_labels": 1, "problem_type": "regression"}

    def encode(self, tok: Any, rows: list[dict], pair: bool, length: int,
               type_vocab: int) -> tuple[dict[str, Any], np.ndarray, Any]:
        return (encode_texts(tok, rows, pair, length, type_vocab),
                np.asarray([r["label"] for r in rows], np.float32), None)

    def predictions(self, logits: np.ndarray, rows: list[dict], extra: Any,
                    label_names: list[str]) -> tuple[list, list]:
        return [r["label"] for r in rows], logits[:, 0].astype(float).tolist()


class Tokens(TaskKind):
    """A label per word (NER-style): aligned to subwords as tokens.py does, read back per word."""

    name = "tokens"
    metrics = ["entity_f1", "token_accuracy"]
    allowed = ("entity_f1", "token_accuracy")
    words = True
    text_wanted = "a list of words (non-empty strings)"

    def text_ok(self, text: Any) -> bool:
        return isinstance(text, list) and bool(text) and all(isinstance(w, str) and w for w in text)

    def label(self, value: Any, names: list[str], indexed: bool, where: str, n_words: int) -> list[int]:
        if not isinstance(value, list):
            raise UserError(f"{where} is {show(value)}; a token task needs a list of labels, one per word")
        if len(value) != n_words:
            raise UserError(f"{where} has {len(value)} labels for {n_words} words; a token task needs one label "
                            f"per word (fix the row so the two lists have the same length)")
        return [class_index(v, names, indexed, where) for v in value]

    def label_values(self, label: Any) -> list[Any]:
        return list(label) if isinstance(label, list) else [label]

    def class_ids(self, label: Any) -> list[int]:
        return list(label)

    def model_class(self) -> Any:
        from transformers import TFAutoModelForTokenClassification

        return TFAutoModelForTokenClassification

    def encode(self, tok: Any, rows: list[dict], pair: bool, length: int,
               type_vocab: int) -> tuple[dict[str, Any], np.ndarray, Any]:
        return tokens.encode_words(tok, rows, length, type_vocab)

    def predictions(self, logits: np.ndarray, rows: list[dict], extra: Any,
                    label_names: list[str]) -> tuple[list, list]:
        fill = tokens.outside_label(label_names)
        name = label_names.__getitem__
        preds = [list(map(name, tokens.word_predictions(ids, p, len(r["label"]), fill)))
                 for ids, p, r in zip(extra, logits.argmax(-1), rows)]
        return [list(map(name, r["label"])) for r in rows], preds  # seqeval reads the tag names (B-, I-, O)

    def token_counts(self, tok: Any, rows: list[dict], pair: bool) -> list[int]:
        enc = tok([r["text"] for r in rows], is_split_into_words=True, truncation=False)
        return [len(ids) for ids in enc["input_ids"]]


KINDS: dict[str, TaskKind] = {k.name: k for k in (Classification(), Regression(), Tokens())}
