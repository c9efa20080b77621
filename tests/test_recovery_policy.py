"""Typed failures and the recovery policy: every failure has a kind that says
whether a retry can help; `decide` is a pure function of (failure, failures so far, config); one
message test per kind (the one-line message stays). No cluster, no training."""

from __future__ import annotations

import errno

import pytest

from tpu_ray.config import RunConfig
from tpu_ray.errors import (EXIT_USAGE, DamagedRunDir, Failure, FailureKind, LostCapacity, NoCapacity,
                            RefusingEnvironment, Superseded, UserError, classify, failure_line, guarded)

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier

RETRYABLE = {FailureKind.LOST_CAPACITY}


def test_only_lost_capacity_is_retryable_and_only_internal_exits_1():
    assert {k for k in FailureKind if k.retryable} == RETRYABLE
    assert {k for k in FailureKind if k.exit_code != EXIT_USAGE} == {FailureKind.INTERNAL}
    for cls, kind in ((UserError, FailureKind.BAD_INPUT), (RefusingEnvironment, FailureKind.REFUSING_ENVIRONMENT),
                      (LostCapacity, FailureKind.LOST_CAPACITY), (NoCapacity, FailureKind.NO_CAPACITY),
                      (DamagedRunDir, FailureKind.DAMAGED_RUN_DIR), (Superseded, FailureKind.SUPERSEDED)):
        assert cls("x").kind is kind and isinstance(cls("x"), UserError)  # `except UserError` catches them all


@pytest.mark.parametrize("kind", list(FailureKind))
@pytest.mark.parametrize("failures_before, max_failures", [(0, 3), (2, 3), (3, 3), (0, 0)])
def test_decide_retries_only_lost_capacity_within_max_failures(kind, failures_before, max_failures):
    from tpu_ray.cluster.recovery import decide

    train = RunConfig.from_dict({"train": {"max_failures": max_failures, "resume_wait_minutes": 2}}).train
    decision = decide(Failure(kind, "line", "E"), failures_before, train)
    expected = kind.retryable and failures_before < max_failures
    assert decision.retry is expected
    assert decision.wait_s == (120.0 if expected else None)
    assert decision.why.startswith(kind.label)


def test_classify_looks_through_ray_and_exception_chains():
    import ray.exceptions as rex

    assert classify(rex.NodeDiedError("node-1")).kind is FailureKind.LOST_CAPACITY
    assert classify(rex.WorkerCrashedError()).kind is FailureKind.LOST_CAPACITY
    wrapped = rex.RayTaskError("train", "traceback", LostCapacity("TPU slice 's' no longer resolves"))
    assert classify(wrapped).kind is FailureKind.LOST_CAPACITY  # raised inside the task, still typed
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError, WorkerHealthCheckTimeoutError

    # A Ray Train worker whose node went away: its health check failed on the dead actor.
    assert classify(WorkerHealthCheckFailedError("gone", rex.ActorDiedError())).kind is FailureKind.LOST_CAPACITY
    assert classify(WorkerHealthCheckTimeoutError("no answer")).kind is FailureKind.LOST_CAPACITY
    bug = rex.RayTaskError("train", "traceback", KeyError("x"))
    assert classify(bug).kind is FailureKind.INTERNAL  # the task's own bug is not a lost node
    try:
        try:
            raise UserError("train.steps=0: must be > 0")
        except UserError as exc:
            raise RuntimeError("wrapper") from exc
    except RuntimeError as exc:
        assert classify(exc).kind is FailureKind.BAD_INPUT


# -- one message per kind: the line a person reads ----------------------------------------------
def test_message_bad_input(tmp_path):
    with pytest.raises(UserError) as err:
        RunConfig.from_dict({"train": {"batch_size": 0}}, origin="cfg.yaml")
    assert err.value.kind is FailureKind.BAD_INPUT
    assert str(err.value).startswith("cfg.yaml: train.batch_size") and "\n" not in str(err.value)


def test_message_refusing_environment():
    failure = classify(OSError(errno.ENOSPC, "No space left on device", "/run/ckpt"))
    assert failure.kind is FailureKind.REFUSING_ENVIRONMENT
    assert failure.line == "/run/ckpt: no space left on device; free space on that disk (or choose another " \
                           "--output-dir), then rerun with --resume"


def test_message_lost_capacity():
    from tpu_ray.train.tpu_init import classify_tpu_error

    exc = classify_tpu_error(ValueError("Could not lookup TPU metadata from name 'slice-b'"), "slice-b", 0,
                             reserved=True)
    assert exc.kind is FailureKind.LOST_CAPACITY
    assert str(exc).startswith("TPU slice 'slice-b' (reserved by Ray) no longer resolves")


def test_message_superseded(tmp_path):
    """(No capacity's message: tests/test_train.py's TestTpuLikeSlices, the missing worker ids of a real reservation.)"""
    from tpu_ray.train.generation import Generation

    old, new = Generation(str(tmp_path)), Generation(str(tmp_path))
    old.claim(), new.claim()
    new.check("commit of ckpt-2")  # the newest attempt writes
    with pytest.raises(UserError) as err:
        old.check("commit of ckpt-3")
    assert err.value.kind is FailureKind.SUPERSEDED
    assert str(err.value) == (f"{tmp_path}: training attempt 1 was superseded by attempt 2 (recovery started a "
                              f"newer one); refusing its commit of ckpt-3 and stopping this attempt")


def test_message_damaged_run_directory(tmp_path):
    from tpu_ray.saved_config import read_saved_config

    (tmp_path / "config.yaml").write_text("")
    with pytest.raises(UserError) as err:
        read_saved_config(str(tmp_path))
    assert err.value.kind is FailureKind.DAMAGED_RUN_DIR
    assert str(err.value) == (f"{tmp_path}/config.yaml: the saved config is empty or not a mapping (damaged); "
                              f"restore it, or use a new --output-dir")
    (tmp_path / "config.yaml").write_text("train:\n  steps: -1\n")  # a saved config no longer valid
    with pytest.raises(UserError) as err:
        read_saved_config(str(tmp_path))
    assert err.value.kind is FailureKind.DAMAGED_RUN_DIR and str(err.value).startswith(f"{tmp_path}/config.yaml: ")


def test_message_internal_and_exit_codes(capsys):
    line, code = failure_line(ValueError("boom"))
    assert code == 1 and line.startswith("ValueError: boom (an internal error; rerun with --verbose")
    assert guarded(lambda: (_ for _ in ()).throw(NoCapacity("no free TPU-v4-8-head"))) == EXIT_USAGE
    assert capsys.readouterr().err.strip() == "tpu-ray: error: no free TPU-v4-8-head"
    with pytest.raises(ValueError):
        guarded(lambda: (_ for _ in ()).throw(ValueError("boom")))


def test_the_recovery_loop_resumes_only_lost_capacity_and_records_both_events(tmp_path):
    """run_with_recovery around an attempt that loses its node once: the second attempt runs with
    resume, the metrics stream has node_lost then resumed_after_failure (where it resumed); an
    attempt failing with bad input is raised at once, with no retry and no event."""
    import json

    import ray.exceptions as rex

    from tpu_ray.cluster.recovery import run_with_recovery

    (tmp_path / "run").mkdir()  # the stage made it before training
    cfg = RunConfig.from_dict({"output_dir": str(tmp_path / "run"), "train": {"max_failures": 2}})
    calls: list[bool] = []

    def attempt(resume: bool, wait_s, on_reserved) -> dict:
        calls.append(resume)
        on_reserved({"placement": "gpu"})
        if len(calls) == 1:
            raise rex.NodeDiedError("node-1")
        return {"steps": 5}

    assert run_with_recovery(cfg.train, cfg.run_dir, False, False, attempt) == {"steps": 5, "failures": 1}
    assert calls == [False, True]
    events = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["node_lost", "resumed_after_failure"]
    assert events[0]["failure_kind"] == "lost_capacity" and events[1]["placement"] == "gpu"

    def bad(resume: bool, wait_s, on_reserved) -> dict:
        calls.append(resume)
        raise UserError("train.batch_size=15 is not divisible by the 2 replicas")

    calls.clear()
    with pytest.raises(UserError):
        run_with_recovery(cfg.train, cfg.run_dir, False, False, bad)
    assert calls == [False]
