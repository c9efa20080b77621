"""Progress that reads well both in a terminal (a live bar) and in `ray job logs` (periodic lines)."""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("tpu_ray.prepare.progress")


class Progress:
    """Units done of a total, with samples and tokens/s; a rich bar on a TTY, else a line every 10 s."""

    def __init__(self, stage: str, total: int, done: int = 0, unit: str = "units", every_s: float = 10.0,
                 samples: int = 0, tokens: int = 0):
        self.stage, self.total, self.done, self.unit = stage, total, done, unit
        self.samples, self.tokens = samples, tokens
        self._t0 = self._last = time.monotonic()
        self._tokens0 = tokens  # the rate counts this run's tokens only (not resumed ones)
        self._every = every_s
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
        return (self.tokens - self._tokens0) / elapsed if elapsed > 0 else 0.0

    def text(self) -> str:
        return (f"{self.done}/{self.total} {self.unit}, {self.samples:,} samples, "
                f"{self._rate():,.0f} tokens/s")

    def advance(self, n: int = 1, samples: int | None = None, tokens: int | None = None) -> None:
        self.done += n
        if samples is not None:
            self.samples = samples
        if tokens is not None:
            self.tokens = tokens
        self.tick(force=self.done == self.total)

    def tick(self, force: bool = False) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, info=self.text())
            return
        now = time.monotonic()
        if force or now - self._last >= self._every:
            self._last = now
            log.info("[%s] %s", self.stage, self.text())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
