"""How one sweep's learning rate is chosen and how a mean over seeds is printed: one rule for
`tpu-ray finetune`'s summary (sweep.py), the report and compare (history.py). Plain Python, so the
command line loads it without pandas or scipy."""

from __future__ import annotations

import math


def mean_of(values) -> float:
    """The mean as sweep.Summary computes it (math.fsum: exact, whatever the order of the seeds)."""
    values = [float(v) for v in values]
    return math.fsum(values) / len(values) if values else math.nan


TIE = 1e-9  # means this close are one score (two seeds' k/n accuracies summed in another order)


def choose_lr(means: dict[float, float]) -> float | None:
    """The learning rate with the best mean validation score; a tie (within TIE) goes to the smallest
    rate: one rule for finetune's summary, the report and compare, whatever order the grid was given in."""
    done = {float(lr): m for lr, m in means.items() if m is not None and math.isfinite(m)}
    if not done:
        return None
    top = max(done.values())
    return min(lr for lr, m in done.items() if m >= top - TIE)


def spread(mean: float, sd: float, n: int) -> str:
    """`mean ± sd`; one seed has no sd, so none is printed (never a ± 0 that looks like no spread)."""
    return f"{mean:.4f} ± {sd:.4f}" if n > 1 else f"{mean:.4f} (one seed: no sd)"
