"""Progress that reads well both in a terminal (a live bar) and in `ray job logs` (periodic lines)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

log = logging.getLogger("tpu_ray.prepare.progress")


class Progress:
    """Units done of a total, with samples and tokens/s; a rich bar on a TTY, else a line every 10 s."""

    def __init__(self, stage: str, total: int, done: int = 0, unit: str = "units", every_s: float = 10.0,
                 samples: int = 0, tokens: int = 0, live: Callable[[], list[dict]] | None = None,
                 counts: bool = True):
        self.stage, self.total, self.done, self.unit = stage, total, done, unit
        self.samples, self.tokens = samples, tokens
        self._t0 = self._last = time.monotonic()
        self._tokens0 = tokens  # the rate counts this run's tokens only (not resumed ones)
        self._done0 = done  # units an earlier run committed: shown apart, not in the ETA's rate
        self._every = every_s
        self._live_fn = live  # units in progress, per actor: their tokens so far count in the rate
        self._live: list[dict] = []
        self._live_at = 0.0
        self._counts = counts  # False: a pass that makes no samples (the shard check): units and ETA only
        self._bar = None
        if sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn(f"[bold]{stage}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[info]}"), TimeElapsedColumn(), transient=False)
            self._task = self._bar.add_task(stage, total=total, completed=done, info="")
            self._bar.start()

    def _rate(self) -> float:
        elapsed = time.monotonic() - self._t0
        live = sum(u.get("tokens", 0) for u in self._live)
        return (self.tokens + live - self._tokens0) / elapsed if elapsed > 0 else 0.0

    def _live_text(self) -> str:
        if not self._live:
            return ""
        if len(self._live) <= 8:  # per actor while few; a sum for large pools
            parts = [f"unit {u['unit']}: {u['lines']:,} lines {u['chars'] / 1e6:.1f} MB {u['tokens']:,} tokens"
                     for u in sorted(self._live, key=lambda u: u["unit"])]
            return "; in progress: " + ", ".join(parts)
        lines = sum(u["lines"] for u in self._live)
        chars = sum(u["chars"] for u in self._live)
        tokens = sum(u["tokens"] for u in self._live)
        return (f"; in progress: {len(self._live)} units, {lines:,} lines {chars / 1e6:.1f} MB "
                f"{tokens:,} tokens")

    def eta_s(self) -> float | None:
        """Seconds left at this run's pace (units done by this run per second); None before one is done."""
        done_here = self.done - self._done0
        if done_here <= 0 or self.done >= self.total:
            return None
        return (time.monotonic() - self._t0) / done_here * (self.total - self.done)

    def text(self) -> str:
        resumed = f" ({self._done0} resumed)" if self._done0 else ""
        eta = self.eta_s()
        left = f", ETA {int(eta // 60)}:{int(eta % 60):02d}" if eta is not None else ""
        if not self._counts:
            return f"{self.done}/{self.total} {self.unit}{resumed}{left}"
        return (f"{self.done}/{self.total} {self.unit}{resumed}, {self.samples:,} samples, "
                f"{self._rate():,.0f} tokens/s{left}{self._live_text()}")

    def advance(self, n: int = 1, samples: int | None = None, tokens: int | None = None) -> None:
        self.done += n
        if samples is not None:
            self.samples = samples
        if tokens is not None:
            self.tokens = tokens
        self.tick(force=self.done == self.total)

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        due = self._bar is not None or force or now - self._last >= self._every
        if self.done >= self.total:
            self._live = []
        elif due and self._live_fn is not None and now - self._live_at >= 2.0:  # a Ray round trip: not per unit
            self._live_at = now
            self._live = self._live_fn()
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, info=self.text())
            return
        if force or now - self._last >= self._every:
            self._last = now
            log.info("[%s] %s", self.stage, self.text())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
