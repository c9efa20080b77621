"""The training loop's timing: executions of up to `steps_per_execution` steps, and hooks that run
on a grid of steps, each with its own `every=`.

The idea is Levanter's trainer (hooks registered with their own interval, the loop yielding one
record per step); the code is ours. What is specific here: one host round trip runs several steps
(`steps_per_execution`, 64-100 on TPU), and an execution must never cross a hook's boundary, or the
hook would see step 12 when the user asked for every 10. So the next execution's length is the
distance to the nearest boundary of any hook, capped by `steps_per_execution` and the run's end.
Hooks with `every=None` run after every execution and do not shape the grid (e.g. time-based work).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class StepInfo:
    """What one execution did: hooks read it. `sums` = (loss sum, correct, masked count) over its steps."""

    step: int  # the global step after this execution
    prev: int  # the global step before it
    total: int  # the run's last step
    sums: Any
    seconds: float  # wall time of the execution, input wait included
    input_wait: float  # seconds spent waiting for the batch (NaN when not separable: n > 1)

    @property
    def steps(self) -> int:
        return self.step - self.prev

    @property
    def last(self) -> bool:
        return self.step >= self.total


@dataclass
class Hook:
    """`fn(info)` after every execution that lands on a multiple of `every` (and at the run's end;
    `at_end=False` opts out). `every=None`: after every execution."""

    name: str
    every: int | None
    fn: Callable[[StepInfo], None]
    at_end: bool = True

    def due(self, info: StepInfo) -> bool:
        if self.every is None:
            return True
        return info.step % self.every == 0 or (self.at_end and info.last)


class Hooks:
    """The loop's periodic tasks, run in the order added (accumulation before logging, logging before
    checkpointing). A new periodic task (a downstream evaluation, an upload) is one `add` call, not an
    edit of the loop; the executions' grid follows every `every` given here."""

    def __init__(self) -> None:
        self._hooks: list[Hook] = []

    def add(self, name: str, every: int | None, fn: Callable[[StepInfo], None], at_end: bool = True) -> Hook:
        if name in self:
            raise ValueError(f"a hook named {name!r} is already added")
        if every is not None and every < 1:
            raise ValueError(f"hook {name!r}: every={every}; give a positive number of steps, or None")
        hook = Hook(name, every, fn, at_end)
        self._hooks.append(hook)
        return hook

    def __getitem__(self, name: str) -> Hook:
        for hook in self._hooks:
            if hook.name == name:
                return hook
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return any(hook.name == name for hook in self._hooks)

    def __iter__(self) -> Iterator[Hook]:
        return iter(self._hooks)


def next_length(step: int, total: int, steps_per_execution: int, everies: Iterable[int | None]) -> int:
    """Steps in the next execution: up to `steps_per_execution`, never past `total` nor past the next
    multiple of any `every` (so no execution crosses a log, eval or checkpoint boundary)."""
    n = min(steps_per_execution, total - step)
    for every in everies:
        if every:
            n = min(n, (step // every + 1) * every - step)
    return max(n, 1)


def run_hooks(hooks: Iterable[Hook], info: StepInfo) -> None:
    """In registration order: accumulation before logging, logging before checkpointing."""
    for hook in hooks:
        if hook.due(info):
            hook.fn(info)


def executions(start: int, total: int, steps_per_execution: int, hooks: Iterable[Hook],
               execute: Callable[[int], tuple[Any, float, float]], stop: int | None = None) -> Iterator[StepInfo]:
    """Run executions from `start` to `stop` (default: `total`, the run's last step); yield each
    one's StepInfo after its hooks ran. A phase (train.phases) stops at its end: no execution
    crosses it.

    `execute(n)` runs n steps and returns (sums, seconds, input_wait).
    """
    step = start
    end = total if stop is None else min(stop, total)
    everies = [h.every for h in hooks]
    while step < end:
        n = next_length(step, end, steps_per_execution, everies)
        sums, seconds, input_wait = execute(n)
        info = StepInfo(step + n, step, total, sums, seconds, input_wait)
        step = info.step
        run_hooks(hooks, info)
        yield info
