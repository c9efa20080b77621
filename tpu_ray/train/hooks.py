"""The training loop's timing: executions of up to `steps_per_execution` steps, and hooks that run
on a grid of steps, each with its own `every=`.

The idea is Levanter's trainer (hooks registered with their own interval, the loop yielding one
record per step); the code is ours. What is specific here: one host round trip runs several steps
(`steps_per_execution`, 64-100 on TPU), and an execution must never cross a hook's boundary, or the
hook would see step 12 when the user asked for every 10. So the next execution's length is the
distance to the nearest boundary of any hook, capped by `steps_per_execution` and the run's end.
Hooks added with `every=None` run after every execution and do not shape the grid (e.g. time-based work).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple


class TrainSums(NamedTuple):
    """What a train step sums over the masked positions of the global batch, in the order the traced
    step stacks it (a traced step returns one tensor)."""

    loss: Any  # cross-entropy, nats
    correct: Any  # right predictions
    count: Any  # masked tokens scored
    unscored: Any  # masked pieces beyond the predictions bound (never scored)


@dataclass
class StepInfo:
    """What one execution did: hooks read it. `sums`: TrainSums over its steps."""

    step: int  # the global step after this execution
    prev: int  # the global step before it
    total: int  # the run's last step
    sums: TrainSums | None
    seconds: float  # wall time of the execution, input wait included
    input_wait: float  # seconds spent waiting for the batch (NaN when not separable: n > 1)

    @property
    def steps(self) -> int:
        return self.step - self.prev

    @property
    def last(self) -> bool:
        return self.step >= self.total


class Hook:
    """A periodic task holding its own state (the log's interval sums, the last evaluation...).

    `see(info)` runs after every execution, before any hook is due (what a task sums over steps);
    `run(step, last)` runs on the hook's grid (Hooks.add's `every`), and whenever the loop asks for
    it by name (Hooks.force: a train record at a span's end, the starting model's evaluation), with
    the step alone: no made-up execution record is needed. `last`: the run's last step."""

    name = ""

    def see(self, info: StepInfo) -> None:
        """After every execution (default: nothing)."""

    def run(self, step: int, last: bool = False) -> None:
        raise NotImplementedError


class Call(Hook):
    """A function of the step as a hook: a task with no state of its own (an upload, a test's probe)."""

    def __init__(self, name: str, fn: Callable[[int], None]) -> None:
        self.name, self.fn = name, fn

    def run(self, step: int, last: bool = False) -> None:
        self.fn(step)


@dataclass
class Scheduled:
    """A hook on its grid: run after every execution that lands on a multiple of one of `every`
    (and at the run's end; `at_end=False` opts out). `every=()`: after every execution."""

    hook: Hook
    every: tuple[int, ...]
    at_end: bool = True

    @property
    def name(self) -> str:
        return self.hook.name

    def due(self, info: StepInfo) -> bool:
        if not self.every:
            return True
        return any(info.step % e == 0 for e in self.every) or (self.at_end and info.last)


class Hooks:
    """The loop's periodic tasks, run in the order added (the log before the checkpoint). A new
    periodic task (a downstream snapshot, an upload) is one `add` call, not an edit of the loop; the
    executions' grid follows every `every` given here."""

    def __init__(self) -> None:
        self._entries: list[Scheduled] = []

    def add(self, hook: Hook, every: int | Iterable[int] | None, at_end: bool = True) -> Hook:
        """`every`: steps between runs, several grids (a snapshot per task's own), or None: every execution."""
        if hook.name in self:
            raise ValueError(f"a hook named {hook.name!r} is already added")
        grid = () if every is None else (every,) if isinstance(every, int) else tuple(sorted(set(every)))
        if any(e < 1 for e in grid):
            raise ValueError(f"hook {hook.name!r}: every={every}; give a positive number of steps, or None")
        self._entries.append(Scheduled(hook, grid, at_end))
        return hook

    def force(self, name: str, step: int, last: bool = False) -> None:
        """Run hook `name` at `step` now, off its grid."""
        self[name].run(step, last)

    def entry(self, name: str) -> Scheduled:
        for e in self._entries:
            if e.name == name:
                return e
        raise KeyError(name)

    def __getitem__(self, name: str) -> Hook:
        return self.entry(name).hook

    def __contains__(self, name: object) -> bool:
        return any(e.name == name for e in self._entries)

    def __iter__(self) -> Iterator[Scheduled]:
        return iter(self._entries)

    def everies(self) -> list[int]:
        return [e for entry in self._entries for e in entry.every]


def next_length(step: int, total: int, steps_per_execution: int, everies: Iterable[int]) -> int:
    """Steps in the next execution: up to `steps_per_execution`, never past `total` nor past the next
    multiple of any `every` (so no execution crosses a log, eval or checkpoint boundary)."""
    n = min(steps_per_execution, total - step)
    for every in everies:
        if every:
            n = min(n, (step // every + 1) * every - step)
    return max(n, 1)


def run_hooks(hooks: Hooks, info: StepInfo) -> None:
    """In the order added: each hook sees the execution, then runs if its grid says so."""
    for entry in hooks:
        entry.hook.see(info)
        if entry.due(info):
            entry.hook.run(info.step, info.last)


def executions(start: int, total: int, steps_per_execution: int, hooks: Hooks,
               execute: Callable[[int], tuple[Any, float, float]], stop: int | None = None) -> Iterator[StepInfo]:
    """Run executions from `start` to `stop` (default: `total`, the run's last step); yield each
    one's StepInfo after its hooks ran. A phase (train.phases) stops at its end: no execution
    crosses it.

    `execute(n)` runs n steps and returns (sums, seconds, input_wait).
    """
    step = start
    end = total if stop is None else min(stop, total)
    everies = hooks.everies()
    while step < end:
        n = next_length(step, end, steps_per_execution, everies)
        sums, seconds, input_wait = execute(n)
        info = StepInfo(step + n, step, total, sums, seconds, input_wait)
        step = info.step
        run_hooks(hooks, info)
        yield info
