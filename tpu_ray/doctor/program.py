"""Compile the program the target will run, on this CPU: its precision, its steps per execution, its
per-replica batch and its replica count (N logical CPU devices under MirroredStrategy stand in for N
replicas), with the trainer's own build() / make_train_step() and the real input pipeline.

The forward and backward pass of every replica go through XLA (jit_compile=True), as on a TPU; the
optimizer update is the strategy's cross-replica merge, as in training. The multi-step function
takes its step count as a tensor, so the program compiled for `steps_per_execution=100` is the one
executed here with n=2. Logical CPU devices can only be set before TensorFlow starts, so when this
process already runs TensorFlow with another device count the probe runs in a fresh process
(`python -m tpu_ray.doctor.program`: the request pickled in, the result as JSON out).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from pathlib import Path

from tpu_ray.config import RunPaths, TrainConfig
from tpu_ray.errors import UserError
from tpu_ray.train.model import ModelSpec

RUN_STEPS = 2  # steps per execution actually run (the compiled loop takes its count as a tensor)


@dataclass(frozen=True)
class BuildSpec:
    """What the trainer's build() and its masking are given, built by doctor from the run (at the
    probe's depth): the train section (optimizer, schedule, masking), the run's locations (its
    tokenizer; `paths.seq_len` the masking's length), the seed, and what the model is made from."""

    train: TrainConfig
    paths: RunPaths
    seed: int
    model: ModelSpec


@dataclass(frozen=True)
class Program:
    """What is compiled: printed by doctor exactly as given."""

    replicas: int
    precision: str
    steps_per_execution: int
    per_replica_batch: int
    seq_len: int

    def describe(self) -> str:
        spe = (f"steps_per_execution={self.steps_per_execution} (one compiled loop, run here with n={RUN_STEPS})"
               if self.steps_per_execution > 1 else "steps_per_execution=1")
        return (f"{self.replicas} replica(s) as {self.replicas} logical CPU device(s), {self.precision}, {spe}, "
                f"per-replica batch [{self.per_replica_batch}, {self.seq_len}], forward+backward under XLA")


def unsupported_ops(message: str) -> list[str]:
    """Op names from an XLA compile error ("No registered 'AsString' OpKernel for XLA_CPU_JIT")."""
    ops = re.findall(r"No registered '([^']+)' OpKernel for XLA", message)
    if not ops:
        ops = re.findall(r"\{\{node ([^}]+)\}\}", message)
    return list(dict.fromkeys(ops))


def op_origin(message: str) -> str:
    """Where the first unsupported op was created, from TF's "The op is created at:" trace."""
    tail = message.split("The op is created at:", 1)
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', tail[1]) if len(tail) > 1 else []
    if not frames:
        return ""
    path, line, fn = frames[-1]
    return f" (created at {Path(path).name}:{line} in {fn})"


def target_precision(train: TrainConfig, kind: str) -> str:
    """The precision training picks on `kind` (strategy.select's rule), float32 on CPU."""
    p = train.mixed_precision
    return {"tpu": "mixed_bfloat16", "gpu": "mixed_float16"}.get(kind, "float32") if p == "auto" else p


def target_steps_per_execution(train: TrainConfig, kind: str) -> int:
    return train.steps_per_execution or (64 if kind == "tpu" else 1)


def compile_program(spec: BuildSpec, tok: Any, program: Program, files: list[str]) -> dict[str, Any]:
    """Build, compile and run the program here; needs `program.replicas` CPU devices in this process.
    Returns {"ok", "compile_s", "step_s", "traces", "loss"} or {"ok": False, "error": message}."""
    import tensorflow as tf
    import tf_keras

    from tpu_ray.train.inputs import train_dataset
    from tpu_ray.train.loop import build, make_train_step, mask_spec
    from tpu_ray.train.strategy import StrategyInfo

    cpus = [d.name for d in tf.config.list_logical_devices("CPU")][: program.replicas]
    strategy = tf.distribute.MirroredStrategy(cpus) if program.replicas > 1 else tf.distribute.get_strategy()
    previous = tf_keras.mixed_precision.global_policy().name
    tf_keras.mixed_precision.set_global_policy(program.precision)
    try:
        info = StrategyInfo(strategy, "cpu", program.replicas, "cpu", program.precision, True,
                            program.steps_per_execution)
        s = build(spec.train, spec.paths, spec.seed, spec.model, info, tok)
        train_step, train_steps = make_train_step(s)
        masks = mask_spec(spec.train, spec.paths, tok)
        dist = strategy.distribute_datasets_from_function(
            lambda ctx: train_dataset(files, program.seq_len, program.per_replica_batch, masks, spec.seed, 64))
        iterator = iter(dist)
        multi = program.steps_per_execution > 1

        def execute():
            return (train_steps(iterator, tf.constant(RUN_STEPS)) if multi else train_step(next(iterator))).numpy()

        t0 = time.perf_counter()
        first = execute()
        compile_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        execute()
        step_s = time.perf_counter() - t1
    except tf.errors.OpError as exc:
        return {"ok": False, "error": exc.message or str(exc)}
    except UserError as exc:  # e.g. a model type that cannot train in the target's precision
        return {"ok": False, "error": str(exc)}
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)
    fn = train_steps if multi else train_step
    return {"ok": True, "compile_s": compile_s, "step_s": step_s, "traces": fn.experimental_get_tracing_count(),
            "loss": float(first[0] / max(first[2], 1.0))}


def can_host(replicas: int) -> bool:
    """True if this process has (or can still make) `replicas` CPU devices for TensorFlow."""
    import tensorflow as tf

    from tpu_ray.train.strategy import use_logical_cpus

    if replicas <= 1:
        return True
    try:
        use_logical_cpus(replicas)
    except Exception:  # noqa: BLE001 (UserError: TF already started with another count)
        return False
    return len(tf.config.list_logical_devices("CPU")) >= replicas


def run_program(spec: BuildSpec, tok: Any, program: Program, files: list[str], timeout_s: float = 1800) -> dict:
    """compile_program here if this process can host the replicas, else in a fresh process. The
    request is pickled: its sections and specs reach the same package in a child of this process as
    they are, with no second (JSON) form of each to keep in step."""
    if can_host(program.replicas):
        return compile_program(spec, tok, program, files)
    request = {"spec": spec, "tok": tok, "program": program, "files": files}
    proc = subprocess.run([sys.executable, "-m", "tpu_ray.doctor.program"], input=pickle.dumps(request),
                          capture_output=True, timeout=timeout_s,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")})
    lines = proc.stdout.decode(errors="replace").strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "error": f"compile process exited {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


def main() -> None:
    from tpu_ray.train.strategy import use_logical_cpus

    request = pickle.loads(sys.stdin.buffer.read())  # from run_program, the parent process
    program = request["program"]
    if program.replicas > 1:
        use_logical_cpus(program.replicas)  # before TensorFlow starts
    result = compile_program(request["spec"], request["tok"], program, request["files"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
