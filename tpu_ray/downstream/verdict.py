"""Did pretraining help? Two checkpoints fine-tuned on the same task with the same seeds, compared seed by seed.

The same seed gives both fine-tunes the same data order (and the same head init when the architectures
match), so the score differences are paired: the verdict is the mean of the per-seed differences B - A
with its 95% Student t interval (n - 1 degrees of freedom), in points (the metric x 100). A seed that
finished for only one model (or whose score is not a finite number) is left out, and the words say so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


# A sample sd this small (in points) is rounding in the subtraction, not spread: every paired
# difference is the same, and the interval is that one point.
_SD_ZERO = 1e-9


def points(x: float) -> float:
    """A metric's fraction (0.8589) in points (85.89)."""
    return 100.0 * x


def _t(n: int) -> float:
    """The 0.975 quantile of Student t with n - 1 degrees of freedom (n >= 2)."""
    from scipy import stats as sps  # scipy.stats takes ~0.5 s to import: only when a verdict is computed

    return float(sps.t.ppf(0.975, n - 1))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass(frozen=True)
class Verdict:
    baseline: str           # label of model A (e.g. "scratch")
    candidate: str          # label of model B (e.g. "continued")
    metric: str             # e.g. "accuracy"
    split: str              # "test" or "validation" (what the scores are)
    seeds: tuple[int, ...]  # the seeds paired (both finished)
    mean: float             # mean over paired seeds of (B - A), in points (metric x 100); nan when n = 0
    half_width: float       # 95% CI half-width in points (Student t, n-1 df); nan when n < 2
    sd: float               # sample sd of the paired differences, points; nan when n < 2
    left_out: tuple[int, ...] = ()  # seeds with a finite score for only one of the two models

    def low(self) -> float:
        return self.mean - self.half_width

    def high(self) -> float:
        return self.mean + self.half_width

    def seeds_to_resolve(self, points: float = 1.0) -> int | None:
        """The smallest n (at least 2) with t_{0.975,n-1} * sd / sqrt(n) <= points, taking this sd as the
        spread of the differences; None when the sd is unknown (fewer than 2 paired seeds)."""
        if not (points > 0 and math.isfinite(points)):
            raise ValueError(f"points must be a positive number, got {points!r}")
        if math.isnan(self.sd):
            return None
        if self.sd == 0:
            return 2
        # t_{0.975,n-1} > z_{0.975} for every n, so n must exceed (z * sd / points)^2: start there.
        from scipy import stats as sps

        z = float(sps.norm.ppf(0.975))
        n = max(2, math.floor((z * self.sd / points) ** 2))
        while _t(n) * self.sd / math.sqrt(n) > points:
            n += 1
        return n

    def _what(self) -> str:
        return f"points of {self.split} {self.metric}"

    def _left_out_words(self) -> str:
        if not self.left_out:
            return ""
        seeds = ", ".join(str(s) for s in self.left_out)
        return (f"; {_plural(len(self.left_out), 'seed')} left out, finished by only one of the two "
                f"({seeds})")

    def words(self) -> str:
        """The verdict in one line."""
        n = len(self.seeds)
        if n < 2:
            return (f"cannot judge: {_plural(n, 'paired seed')} (at least 2 needed; run more seeds)"
                    f"{self._left_out_words()}")
        paired_ = _plural(n, "paired seed")
        if self.sd == 0:
            if self.mean == 0:
                return (f"no difference: {self.candidate} and {self.baseline} score the same {self.split} "
                        f"{self.metric} on every one of {paired_} (no spread, so no interval)"
                        f"{self._left_out_words()}")
            if n < 3:  # two equal differences are common with whole-count accuracies: too few to call it
                return (f"cannot judge: both paired seeds differ by {_fixed(self.mean, [self.mean])} {self._what()} "
                        f"(no spread from 2 seeds; run at least 3){self._left_out_words()}")
            side = "better" if self.mean > 0 else "worse"
            return (f"{self.candidate} is {side} than {self.baseline} by {_fixed(abs(self.mean), [self.mean])} "
                    f"{self._what()} on every one of {paired_} (every paired difference is the same, "
                    f"so the interval is that one point){self._left_out_words()}")
        low, high = self.low(), self.high()
        if low > 0 or high < 0:
            side = "better" if self.mean > 0 else "worse"
            d = _decimals([self.mean, self.half_width, low, high])
            return (f"{self.candidate} is {side} than {self.baseline} by {_fixed(abs(self.mean), d=d)} ± "
                    f"{_fixed(self.half_width, d=d)} {self._what()} (95% CI {_fixed(low, d=d)} to "
                    f"{_fixed(high, d=d)}, {paired_}){self._left_out_words()}")
        need = self.seeds_to_resolve(1.0)
        if need is not None and need > n:
            more = f"; about {need} seeds would resolve 1 point"
        else:
            more = "; the interval is already within ±1 point: any difference is smaller than that"
        return (f"no difference detectable with {_plural(n, 'seed')} ({self.candidate} − {self.baseline} = "
                f"{_fixed(self.mean, d=1)} ± {_fixed(self.half_width, d=1)} {self._what()}, 95% CI)"
                f"{more}{self._left_out_words()}")


def _decimals(values: list[float]) -> int:
    """One decimal, or more (up to 4) while a nonzero value would print as 0."""
    d = 1
    while d < 4 and any(v != 0 and round(v, d) == 0 for v in values):
        d += 1
    return d


def _fixed(x: float, values: list[float] | None = None, d: int | None = None) -> str:
    if d is None:
        d = _decimals(values if values is not None else [x])
    text = f"{x:.{d}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.0"


def _finite(v) -> bool:
    try:
        return v is not None and math.isfinite(v)
    except TypeError:
        return False


def paired(baseline: str, a: dict[int, float], candidate: str, b: dict[int, float], metric: str,
           split: str) -> Verdict:
    """The verdict on candidate (scores `b`) against baseline (scores `a`): seed -> score as the metric
    gives it (a fraction such as 0.8589). Paired by seed; a seed without a finite score in both is left out."""
    a_ok = {int(s): float(v) for s, v in a.items() if _finite(v)}
    b_ok = {int(s): float(v) for s, v in b.items() if _finite(v)}
    seeds = tuple(sorted(a_ok.keys() & b_ok.keys()))
    left_out = tuple(sorted(a_ok.keys() ^ b_ok.keys()))
    diffs = [points(b_ok[s]) - points(a_ok[s]) for s in seeds]
    n = len(diffs)
    mean = statistics.fmean(diffs) if n else math.nan
    if n < 2:
        sd = half_width = math.nan
    else:
        sd = statistics.stdev(diffs)
        if sd <= _SD_ZERO:
            sd = 0.0
        half_width = _t(n) * sd / math.sqrt(n)
    return Verdict(baseline=baseline, candidate=candidate, metric=metric, split=split, seeds=seeds, mean=mean,
                   half_width=half_width, sd=sd, left_out=left_out)
