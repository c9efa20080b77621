"""The metrics encoder papers report, computed by the libraries that define them.

scikit-learn (accuracy, binary and macro F1, Matthews correlation), scipy (Pearson, Spearman),
seqeval (entity-level F1 for token classification: an entity counts only when its type and its
whole span match, the CoNLL definition Hugging Face's run_ner.py reports). Nothing is hand-written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def _accuracy(y: Sequence, p: Sequence) -> float:
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(y, p))


def _f1(y: Sequence, p: Sequence) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(y, p, average="binary", zero_division=0))


def _macro_f1(y: Sequence, p: Sequence) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(y, p, average="macro", zero_division=0))


def _matthews(y: Sequence, p: Sequence) -> float:
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(y, p))


def _pearson(y: Sequence, p: Sequence) -> float:
    from scipy.stats import pearsonr

    return float(pearsonr(y, p)[0])


def _spearman(y: Sequence, p: Sequence) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(y, p)[0])


def _entity_f1(y: Sequence[Sequence[str]], p: Sequence[Sequence[str]]) -> float:
    from seqeval.metrics import f1_score

    return float(f1_score([list(s) for s in y], [list(s) for s in p]))


def _token_accuracy(y: Sequence[Sequence[Any]], p: Sequence[Sequence[Any]]) -> float:
    pairs = [(a, b) for ys, ps in zip(y, p) for a, b in zip(ys, ps)]
    return sum(a == b for a, b in pairs) / len(pairs)


METRICS: dict[str, Callable[[Any, Any], float]] = {
    "accuracy": _accuracy, "f1": _f1, "macro_f1": _macro_f1, "matthews": _matthews,
    "pearson": _pearson, "spearman": _spearman, "entity_f1": _entity_f1, "token_accuracy": _token_accuracy,
}


def score(names: Sequence[str], labels: Sequence, predictions: Sequence) -> dict[str, float]:
    """Each named metric of predictions against labels (classes, floats, or per-word tag lists)."""
    return {name: METRICS[name](labels, predictions) for name in names}
