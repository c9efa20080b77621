"""The scheduler of the shard actors: every actor busy with one work unit, a unit whose actor died
retried on a fresh actor a bounded number of times.

Why by hand rather than `ray.util.ActorPool` or Ray Data: neither requeues the unit of an actor
that died on a fresh actor nor bounds the retries per unit, and the manifest needs each unit's
result in the driver as soon as it is done (resume skips committed units).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tpu_ray.errors import UserError
from tpu_ray.prepare.corpus import WorkUnit

log = logging.getLogger("tpu_ray.prepare.shards")  # its lines belong to the sharding stage


# How long the pool may go without a finished unit before it checks whether its actors started at all.
STALL_S = 120.0


def run_on_pool(pool: list, units: list[WorkUnit], method: str, new_actor, on_done, progress,
                 max_retries: int = 3, stall_s: float = STALL_S) -> None:
    """Keep every actor busy with one unit; a unit whose actor died goes to a fresh actor, at most
    `max_retries` times (then `UnitFailedError`: a poison unit must not be retried forever). So
    does the unit of an actor that answers nothing while Ray's control store has it alive, once
    `stall_s` pass without a finished unit (unanswering_actors).

    Finished actors get their next unit before the driver records the finished ones (manifest
    write, progress), so no actor waits on the driver's bookkeeping.
    """
    import ray
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

    queue = list(reversed(units))
    running: dict[Any, tuple[Any, WorkUnit]] = {}
    idle = list(pool)
    finished: list[tuple[WorkUnit, dict]] = []
    deaths: dict[int, int] = {}
    last_result, warned = time.monotonic(), False

    def retry_on_new_actor(actor, unit: WorkUnit) -> None:
        """The unit back in the queue, its actor (dead or given up on) swapped for a fresh one."""
        pool.remove(actor)
        replacement = new_actor()
        pool.append(replacement)
        idle.append(replacement)
        queue.append(unit)

    while queue or running or finished:
        while queue and idle:
            actor = idle.pop()
            unit = queue.pop()
            running[getattr(actor, method).remote(unit.to_dict())] = (actor, unit)
        for unit, res in finished:
            on_done(unit, res)
        finished.clear()
        if not running:
            continue
        ready, _ = ray.wait(list(running), num_returns=1, timeout=5.0)
        if progress:
            progress.tick()
        if ready:
            last_result = time.monotonic()
        elif time.monotonic() - last_result > stall_s:
            busy = {actor: (ref, unit) for ref, (actor, unit) in running.items()}
            lost = unanswering_actors(list(busy), wait_s=min(10.0, stall_s))
            for actor in lost:
                ref, unit = busy[actor]
                del running[ref]
                deaths[unit.index] = deaths.get(unit.index, 0) + 1
                if deaths[unit.index] > max_retries:
                    raise UnitFailedError(f"unit {unit.index} ({describe_unit(unit)}): its actor answered nothing "
                                          f"for {stall_s:.0f} s, {deaths[unit.index]} times; see the shard actors' "
                                          f"logs (ray logs) for where they hang") from None
                log.warning("actor on unit %d answered nothing for %.0f s though Ray has it alive; replaced, "
                            "retry %d of %d", unit.index, stall_s, deaths[unit.index], max_retries)
                ray.kill(actor)
                retry_on_new_actor(actor, unit)
            if lost:
                last_result = time.monotonic()
            elif not warned:
                warned = _warn_if_unstarted(pool, stall_s)
        for ref in ready:
            actor, unit = running.pop(ref)
            try:
                finished.append((unit, ray.get(ref)))
            except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
                deaths[unit.index] = deaths.get(unit.index, 0) + 1
                if deaths[unit.index] > max_retries:
                    raise UnitFailedError(unit_failure_line(unit, deaths[unit.index], exc)) from None
                log.warning("actor died while on unit %d (%s); retry %d of %d on a new actor",
                            unit.index, type(exc).__name__, deaths[unit.index], max_retries)
                retry_on_new_actor(actor, unit)
                continue
            except RayTaskError as exc:
                cause = exc.cause if hasattr(exc, "cause") else None
                if isinstance(cause, UserError):
                    raise cause from None
                raise
            idle.append(actor)


def unstarted_actors(pool: list, wait_s: float = 2.0) -> list:
    """The actors of `pool` whose process has not started (still waiting for resources or a node)."""
    import ray

    refs = {actor.__ray_ready__.remote(): actor for actor in pool}
    _, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=wait_s)
    return [refs[ref] for ref in waiting]


def unanswering_actors(actors: list, wait_s: float = 10.0) -> list:
    """The actors that Ray's control store (GCS) has alive but that answer no call within `wait_s`.

    A pool's actors run two calls at once (max_concurrency=2), so a busy one still answers. Seen
    here (Ray 2.60, a driver that had run several clusters in turn): the driver never got an
    actor's ALIVE notification, so every call to it waited in the driver for ever while the actor
    sat idle; a wedged actor looks the same. Asking the GCS directly (not through the driver's
    view) tells them apart from actors still waiting for resources."""
    from ray._private import state

    alive = []
    for actor in unstarted_actors(actors, wait_s):
        info = state.actors(actor_id=actor._actor_id.hex()) or {}
        if info.get("State") == "ALIVE":
            alive.append(actor)
    return alive


def _warn_if_unstarted(pool: list, stall_s: float) -> bool:
    """Say why a pool makes no progress when its actors never started: without this, a cluster whose
    CPUs something else holds (a leftover actor or job) shows a progress bar that never moves.
    Only a warning: an autoscaling cluster may still be adding the nodes they wait for."""
    import ray

    waiting = unstarted_actors(pool)
    if not waiting:
        return False
    free, total = ray.available_resources().get("CPU", 0.0), ray.cluster_resources().get("CPU", 0.0)
    log.warning("%d of %d actors have not started after %.0f s without a finished unit: the cluster has "
                "%g of %g CPUs free; `ray status` shows what holds them (a leftover actor or job?) or "
                "whether nodes are still being added", len(waiting), len(pool), stall_s, free, total)
    return True


class UnitFailedError(UserError):
    """A work unit killed its actor more than `shard.max_unit_retries` times."""


def describe_unit(unit: WorkUnit) -> str:
    """`file bytes a-b` (text), `file row groups a-b` (parquet), `source rows a-b` (datasets),
    `file (whole, streamed)` (compressed files, CSV) or the first and last of packed files: where to look."""
    if unit.members:
        return f"{len(unit.members)} packed files, {unit.source} to {unit.members[-1][0]}"
    from tpu_ray.prepare.readers import reader

    return reader(unit.fmt).where(unit)


def unit_failure_line(unit: WorkUnit, deaths: int, exc: BaseException) -> str:
    """The one line a poison unit ends the run with: the unit, how often, the likely cause, the fix."""
    text = str(exc).lower()
    if "memory" in text or "oom" in text:
        cause = "out of memory"
    else:
        cause = "the actor process died (most often out of memory, or a crash in the tokenizer)"
    return (f"shard unit {unit.index} ({describe_unit(unit)}) killed its actor {deaths} times; likely cause: "
            f"{cause}, e.g. a very long line with no newline, which a unit reads whole; split that text into "
            f"lines or lower shard.unit_bytes (shard.max_unit_retries={deaths - 1})")
