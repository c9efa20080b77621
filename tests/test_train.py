"""Training on CPU with the real libraries: XLA discipline, replicas, multi-worker, placement, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO, tiny_config
from tpu_ray.prepare.tfrecord import serialize_examples, write_records

SEQ_LEN = 64
# Shard sizes that are not multiples of the batch (16): several epochs cross ragged file ends.
SHARD_SAMPLES = (37, 29, 41, 23)


def write_shards(shards_dir: Path, vocab_size: int, seed: int = 0) -> None:
    """Reference-format shards (`<split>-<index>-<count>.tfrecord`, no manifest) of random ids."""
    rng = np.random.default_rng(seed)
    shards_dir.mkdir(parents=True, exist_ok=True)
    for split, sizes in (("train", SHARD_SAMPLES), ("validation", (40,))):
        for i, n in enumerate(sizes):
            rows = rng.integers(5, vocab_size, size=(n, SEQ_LEN), dtype=np.int64)
            rows[:, 0], rows[:, -1] = 0, 2  # [CLS] ... [SEP]
            with open(shards_dir / f"{split}-{i:05d}-{n}.tfrecord", "wb") as f:
                write_records(f, serialize_examples(rows))


@pytest.fixture(scope="module")
def shards_dir(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    from tpu_ray.prepare.tokenizer import tokenizer_info

    d = tmp_path_factory.mktemp("shards")
    write_shards(d, tokenizer_info(tiny_tokenizer_dir).vocab_size)
    return d


def _cfg(run_dir: Path, shards: Path, tok: str, **over):
    return tiny_config(run_dir, run_dir / "unused.txt", **{"tokenizer.path": tok, "shard.dir": str(shards), **over})


def _gs_records(run: str) -> list[dict]:
    """Every metrics record of a gs:// run (one object per writer), in time order."""
    from tpu_ray.report import load_metrics

    records = [{k: v for k, v in r.items() if v == v and v is not None} for r in load_metrics(run).to_dict("records")]
    for r in records:  # load_metrics gives time as a datetime; the records hold seconds since the epoch
        if hasattr(r.get("time"), "timestamp"):
            r["time"] = r["time"].timestamp()
    return records


def _records(run_dir: Path, kind: str) -> list[dict]:
    """The run's records of `kind` in time order: metrics.jsonl and, in a shared run directory, every
    writer's own file (metrics_stream.py); a line being written right now is skipped."""
    from tpu_ray.metrics_stream import read_records

    if not run_dir.exists():
        return []
    return sorted((r for r in read_records(str(run_dir)) if r.get("kind") == kind), key=lambda r: r.get("time", 0.0))


def checkpoint_weights(run_dir: Path) -> dict[str, np.ndarray]:
    """The model variables of the run's latest checkpoint, by name."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run_dir / "checkpoints")))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k.startswith("model/")}


def max_abs_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys() and a
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)


def test_several_epochs_over_ragged_shards_trace_the_step_once(tmp_path, shards_dir, tiny_tokenizer_dir):
    from tpu_ray.train.loop import train

    # 130 samples per epoch, batch 16: 40 steps are almost 5 epochs, none a multiple of the batch.
    cfg = _cfg(tmp_path / "run", shards_dir, tiny_tokenizer_dir, **{"train.steps": 40, "train.eval_every": 40})
    summary = train(cfg)
    assert summary["steps"] == 40 and summary["train_traces"] == 1
    records = _records(tmp_path / "run", "train")
    assert [r["train_traces"] for r in records] == [1] * 8
    for key in ("loss", "accuracy", "learning_rate", "step_time_s", "samples_per_s", "tokens_per_s",
                "input_wait_s"):
        assert all(r[key] is not None and r[key] >= 0 for r in records), key
    assert all(r["mfu"] is None for r in records)  # no known peak on a CPU: no made-up MFU
    evals = _records(tmp_path / "run", "eval")
    assert evals and {"eval_loss", "eval_accuracy", "perplexity"} <= set(evals[-1])

    # The same records as TensorBoard scalars.
    scalars = _tensorboard_scalars(tmp_path / "run" / "tensorboard")
    assert sorted(scalars["train/loss"]) == [r["step"] for r in records]
    assert scalars["train/loss"][40] == pytest.approx(records[-1]["loss"], rel=1e-6)
    assert scalars["eval/perplexity"][40] == pytest.approx(evals[-1]["perplexity"], rel=1e-6)


def _tensorboard_scalars(directory: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} from every TensorBoard event file in `directory`, read by TensorFlow."""
    import tensorflow as tf

    out: dict[str, dict[int, float]] = {}
    files = sorted(directory.glob("events.out.tfevents.*"))
    assert files, f"no event files in {directory}"
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                out.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return out


def _train_cmd(cfg_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tpu_ray.cli", "train", "--config", str(cfg_path), *extra]


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_sigkill_then_resume_ends_where_an_uninterrupted_run_ends(tmp_path, shards_dir, tiny_tokenizer_dir):
    from tpu_ray.cli import main

    # 60 steps, a checkpoint every 5: once step 15 is logged, ckpt-5 and ckpt-10 are committed and ~45
    # steps are left (seconds, not one poll) to kill it in.
    # dropout 0: nothing random but data and masks, which resume reproduces; so the weights must match.
    # placement local: the killed process and the resume train in their own process, no Ray cluster
    # started for them (what is killed is the training process; Ray's start-up only cost time).
    steps, every = 60, 5
    over = {"train.steps": steps, "train.checkpoint_every": every, "train.log_every": every,
            "train.eval_every": steps, "model.dropout": 0.0, "train.placement": "local"}
    cfg_path = tmp_path / "cfg.yaml"
    run_dir = tmp_path / "killed"
    cfg_path.write_text(_cfg(run_dir, shards_dir, tiny_tokenizer_dir, **over).to_yaml())
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    log = open(tmp_path / "killed.log", "w")  # what the killed process printed, for the assertions' messages
    proc = subprocess.Popen(_train_cmd(cfg_path), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not any(r["step"] >= 3 * every for r in _records(run_dir, "train")):
            assert proc.poll() is None, ("training ended before it could be killed:\n"
                                         + (tmp_path / "killed.log").read_text()[-3000:])
            assert time.monotonic() < deadline, f"training never reached step {3 * every}"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
        log.close()
    killed_at = max(r["step"] for r in _records(run_dir, "train"))
    assert killed_at < steps

    # Every checkpoint a killed run left behind loads completely.
    import tensorflow as tf

    ckpt_dir = run_dir / "checkpoints"
    state = tf.train.get_checkpoint_state(str(ckpt_dir))
    assert state and state.all_model_checkpoint_paths
    for path in state.all_model_checkpoint_paths:
        reader = tf.train.load_checkpoint(path)
        assert "step/.ATTRIBUTES/VARIABLE_VALUE" in reader.get_variable_to_shape_map()
    last_ckpt_step = int(tf.train.load_checkpoint(state.model_checkpoint_path).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))
    assert 2 * every <= last_ckpt_step <= killed_at and last_ckpt_step % every == 0

    # Without --resume the run directory is refused; with it the run continues to the last step.
    assert main(["train", "--config", str(cfg_path)]) == 2
    assert main(["train", "--config", str(cfg_path), "--resume"]) == 0
    resumed = [r for r in _records(run_dir, "event") if r["event"] == "resume"]
    assert resumed and resumed[-1]["step"] == last_ckpt_step
    after = {r["step"]: r for r in _records(run_dir, "train") if r["time"] > resumed[-1]["time"]}
    assert max(after) == steps and min(after) == last_ckpt_step + every

    # The learning-rate schedule continues from the right step: same values as an uninterrupted run.
    straight_dir = tmp_path / "straight"
    straight = _cfg(straight_dir, shards_dir, tiny_tokenizer_dir, **over)
    from tpu_ray.train.loop import train

    train(straight)
    reference = {r["step"]: r["learning_rate"] for r in _records(straight_dir, "train")}
    for step, record in after.items():
        assert record["learning_rate"] == pytest.approx(reference[step], rel=1e-6), step
    # Resume proves itself: killed + resumed ends with the weights of the uninterrupted run.
    assert max_abs_difference(checkpoint_weights(run_dir), checkpoint_weights(straight_dir)) < 1e-5
    losses = {r["step"]: r["loss"] for r in _records(straight_dir, "train")}
    assert [after[k]["loss"] for k in sorted(after)] == pytest.approx([losses[k] for k in sorted(after)], rel=1e-4)


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_checkpoints_in_a_gs_run_dir_commit_prune_and_resume(gcs_emulator, tmp_path, shards_dir,
                                                             tiny_tokenizer_dir, monkeypatch):
    """A gs:// run directory (emulator): checkpoints are uploaded in TF's own layout, the last K
    kept, a stray half-uploaded checkpoint is never taken for the latest, and --resume continues
    from the committed one."""
    import tensorflow as tf

    from tpu_ray import storage
    from tpu_ray.train.loop import train

    run = f"{gcs_emulator.make_bucket()}/run"
    over = {"train.checkpoint_every": 10, "train.keep_checkpoints": 2, "train.eval_every": 100}
    cfg = _cfg(tmp_path / "unused", shards_dir, tiny_tokenizer_dir, **over).override({"output_dir": run})
    assert train(cfg)["steps"] == 20
    ckpts = f"{run}/checkpoints"
    names = {p.rsplit("/", 1)[-1] for p in storage.listdir(ckpts)}
    assert names == {"checkpoint", "ckpt-10.index", "ckpt-10.data-00000-of-00001", "ckpt-10.position.json",
                     "ckpt-20.index", "ckpt-20.data-00000-of-00001", "ckpt-20.position.json",
                     "generation-1"}  # this attempt's fencing token (train/generation.py)
    assert 'model_checkpoint_path: "ckpt-20"' in storage.read_text(f"{ckpts}/checkpoint")
    assert storage.exists(f"{run}/model/config.json") and storage.glob(f"{run}/metrics/*.jsonl")

    # What TF itself reads from a copy of the bucket: a complete checkpoint at step 20.
    local = tmp_path / "copy"
    for p in storage.listdir(ckpts):
        storage.download_file(p, str(local / p.rsplit("/", 1)[-1]))
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(local)))
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 20

    # A run that dies while uploading ckpt-30 (its data is up, its index is not) never commits it.
    real_copy = storage.atomic_copy_file

    def copy_failing_on_the_index(src: str, dst: str) -> None:
        if dst.endswith("ckpt-30.index"):
            raise storage.StorageError(f"{dst}: upload interrupted (injected)")
        real_copy(src, dst)

    monkeypatch.setattr(storage, "atomic_copy_file", copy_failing_on_the_index)
    with pytest.raises(storage.StorageError, match="injected"):
        train(cfg.override({"train.steps": 40, "train.extend_schedule": True}), resume=True)
    monkeypatch.undo()
    assert storage.exists(f"{ckpts}/ckpt-30.data-00000-of-00001")
    assert 'model_checkpoint_path: "ckpt-20"' in storage.read_text(f"{ckpts}/checkpoint")

    # A stray half-written object is not a checkpoint either.
    storage.atomic_write_bytes(f"{ckpts}/ckpt-25.data-00000-of-00001", b"half")
    with pytest.raises(Exception, match="already has checkpoints"):
        train(cfg.override({"train.steps": 40}))
    summary = train(cfg.override({"train.steps": 40, "train.extend_schedule": True}), resume=True)
    assert summary["resumed_from"] == 20 and summary["steps"] == 40
    names = {p.rsplit("/", 1)[-1] for p in storage.listdir(ckpts)}
    assert names == {"checkpoint", "ckpt-30.index", "ckpt-30.data-00000-of-00001", "ckpt-30.position.json",
                     "ckpt-40.index", "ckpt-40.data-00000-of-00001", "ckpt-40.position.json",
                     "generation-3"}  # strays pruned too; the refused fresh start withdrew its claim
    events = _gs_records(run)
    resumed = [e for e in events if e.get("event") == "resume"]
    assert resumed and resumed[-1]["step"] == 20 and resumed[-1]["checkpoint"] == f"{ckpts}/ckpt-20"

    # TensorBoard events were uploaded too: both runs' evaluations are in them.
    for p in storage.glob(f"{run}/tensorboard/events.out.tfevents.*"):
        storage.download_file(p, str(tmp_path / "tb" / p.rsplit("/", 1)[-1]))
    assert sorted(_tensorboard_scalars(tmp_path / "tb")["eval/eval_loss"]) == [20, 40]

    # `tpu-ray eval` restores the committed step-40 checkpoint: the same loss as training's last eval.
    from tpu_ray.train.evaluate import evaluate_run

    result = evaluate_run(cfg.override({"train.steps": 40}))
    last_eval = [e for e in events if e["kind"] == "eval"][-1]
    assert result["step"] == 40 and last_eval["step"] == 40
    assert result["eval_loss"] == pytest.approx(last_eval["eval_loss"], rel=1e-5)


EQUIVALENCE = r'''
import json, sys
import numpy as np
from tpu_ray.train.strategy import use_logical_cpus
use_logical_cpus(8)
import tensorflow as tf
from tpu_ray.config import RunConfig
from tpu_ray.train.inputs import MaskSpec, mask_tokens, mlm_targets, predictions_per_sequence
from tpu_ray.train.strategy import StrategyInfo, select
from tpu_ray.prepare.tokenizer import TokenizerInfo
from tpu_ray.train.loop import build, make_replica_grads, make_train_step
from tpu_ray.train.model import ModelSpec

cfg = RunConfig.from_dict({"shard": {"seq_len": 32}, "model": {"preset": "tiny", "dropout": 0.0},
                           "train": {"batch_size": 32, "cpu_replicas": 8, "warmup_steps": 0, "steps": 10}})
tok = TokenizerInfo("0" * 64, 500, 0, 2, 1, 3, 4)
eight = select(cfg.train)
assert eight.replicas == 8, eight.replicas
one = StrategyInfo(tf.distribute.OneDeviceStrategy("/cpu:0"), "cpu", 1, "cpu", "float32", False, 1)
spec = ModelSpec(cfg.model, cfg.max_positions(), cfg.shard.seq_len, cfg.tokenizer_dir)
s8, s1 = build(cfg.train, cfg.paths, cfg.seed, spec, eight, tok), build(cfg.train, cfg.paths, cfg.seed, spec, one, tok)
s8.model.set_weights(s1.model.get_weights())

rng = np.random.default_rng(0)
ids = tf.constant(rng.integers(5, 500, size=(32, 32)), tf.int32)
masked, labels = mask_tokens(ids, tf.constant([1, 2], tf.int64), MaskSpec(0.15, 4, 500, (0, 1, 2, 3, 4)))
positions, mlm_labels = mlm_targets(labels, predictions_per_sequence(32, 0.15))
batch = {"input_ids": masked, "attention_mask": tf.ones_like(ids), "mlm_positions": positions,
         "mlm_labels": mlm_labels}

def split(ctx):
    i = ctx.replica_id_in_sync_group
    return {k: v[i * 4:(i + 1) * 4] for k, v in batch.items()}

dist = eight.strategy.experimental_distribute_values_from_function(split)
count = tf.reduce_sum(tf.cast(mlm_labels != -100, tf.float32))
assert int(count) == int(tf.reduce_sum(tf.cast(labels != -100, tf.int32)))  # no masked position left out
g1 = make_replica_grads(s1)(batch, count)[0]
per_replica = eight.strategy.run(lambda b: make_replica_grads(s8)(b, count)[0], args=(dist,))
g8 = [eight.strategy.reduce("sum", g, axis=None) for g in per_replica]
grad_err = max(float(tf.reduce_max(tf.abs(tf.convert_to_tensor(a) - tf.convert_to_tensor(b)))) for a, b in zip(g1, g8))
grad_scale = max(float(tf.reduce_max(tf.abs(tf.convert_to_tensor(a)))) for a in g1)

initial = s1.model.get_weights()
sums1 = make_train_step(s1)[0](batch).numpy()
sums8 = make_train_step(s8)[0](dist).numpy()
w_err = max(float(np.max(np.abs(a - b))) for a, b in zip(s1.model.get_weights(), s8.model.get_weights()))
moved = max(float(np.max(np.abs(a - b))) for a, b in zip(s1.model.get_weights(), initial))
print(json.dumps({"grad_err": grad_err, "grad_scale": grad_scale, "sums1": sums1.tolist(), "sums8": sums8.tolist(),
                  "weight_err": w_err, "moved": moved}))
'''


def test_a_slow_checkpoint_upload_does_not_stop_training(gcs_emulator, tmp_path, shards_dir, tiny_tokenizer_dir,
                                                          monkeypatch):
    """A storage stand-in that takes 4 s to upload ckpt-5's index: steps after the save run while it
    uploads (their records are written before the upload ends), saves asked for meanwhile are
    skipped rather than mixed into it, and every committed checkpoint is complete."""
    import tensorflow as tf

    from tpu_ray import storage
    from tpu_ray.train.loop import train

    run = f"{gcs_emulator.make_bucket()}/run"
    cfg = _cfg(tmp_path / "unused", shards_dir, tiny_tokenizer_dir,
               **{"train.steps": 30, "train.checkpoint_every": 5, "train.log_every": 1,
                  "train.eval_every": 100}).override({"output_dir": run})
    real_copy = storage.atomic_copy_file
    upload: dict[str, float] = {}

    def slow_copy(src: str, dst: str) -> None:
        if dst.endswith("ckpt-5.index"):
            upload["start"] = time.time()
            time.sleep(4.0)
            real_copy(src, dst)
            upload["end"] = time.time()
        else:
            real_copy(src, dst)

    monkeypatch.setattr(storage, "atomic_copy_file", slow_copy)
    assert train(cfg)["steps"] == 30
    steps = [r for r in _gs_records(run) if r["kind"] == "train"]
    during = [r["step"] for r in steps if upload["start"] < r["time"] < upload["end"]]
    assert during and min(during) > 5, "no training step ran while ckpt-5 was uploading"
    ckpts = f"{run}/checkpoints"
    assert 'model_checkpoint_path: "ckpt-30"' in storage.read_text(f"{ckpts}/checkpoint")
    local = tmp_path / "copy"
    for p in storage.listdir(ckpts):
        storage.download_file(p, str(local / p.rsplit("/", 1)[-1]))
    state = tf.train.get_checkpoint_state(str(local))
    for path in state.all_model_checkpoint_paths:  # every checkpoint the state names is complete
        step = int(tf.train.load_checkpoint(path).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE"))
        assert path.endswith(f"ckpt-{step}")
    skipped = {f"ckpt-{s}" for s in during if s % 5 == 0 and s < 30}
    assert not skipped & {Path(p).name for p in state.all_model_checkpoint_paths}  # saves during it: skipped


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_eight_cpu_replicas_take_the_same_step_as_one_device(tmp_path):
    """8 logical CPUs under MirroredStrategy stand in for a v3-8: same gradients, same update."""
    out = subprocess.run([sys.executable, "-c", EQUIVALENCE], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["grad_err"] <= 1e-5 * max(r["grad_scale"], 1.0), r
    assert r["sums1"] == pytest.approx(r["sums8"], rel=1e-5), r
    assert r["moved"] > 0 and r["weight_err"] <= 0.01 * r["moved"], r


def _tpu_host(cluster, pod_type: str, slice_name: str, worker: int, cpus: int = 1):
    """A Ray node shaped like a TPU VM host as Ray 2.60 detects it: resources and labels (`cpus` 0:
    a host only reserved, never run on)."""
    resources = {"TPU": 4, slice_name: 1, **({f"TPU-{pod_type}-head": 1} if worker == 0 else {})}
    return cluster.add_node(num_cpus=cpus, resources=resources, labels={
        "ray.io/tpu-slice-name": slice_name, "ray.io/tpu-worker-id": str(worker), "ray.io/tpu-pod-type": pod_type,
        "ray.io/accelerator-type": "TPU-" + pod_type.split("-")[0].upper()})


@pytest.fixture(scope="class")
def tpu_like_cluster():
    """One multi-node Ray cluster for the TPU-placement tests of TestTpuLikeSlices, built once: a CPU
    head (as in cluster.yaml), a v4-8 host (slice-a) and a two-host v4-16 slice (slice-b, worker 1
    joining first). A test that needs another host adds it. The class runs in a process of its own
    (own_process), so the suite's local cluster is not put back."""
    from types import SimpleNamespace

    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster()
    try:
        # A CPU head, as in cluster.yaml. No dashboard: nothing here asks it, and its ~10 processes cost CPU.
        head = cluster.add_node(num_cpus=1, include_dashboard=False)
        v4_8 = _tpu_host(cluster, "v4-8", "slice-a", 0)
        v4_16 = [_tpu_host(cluster, "v4-16", "slice-b", w) for w in (1, 0)]  # worker 1 joins first
        ray.init(address=cluster.address, log_to_driver=False)
        yield SimpleNamespace(cluster=cluster, head=head, v4_8=v4_8, v4_16=v4_16)
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow  # a 4-node cluster and several TensorFlow start-ups: minutes on 2 cores
@pytest.mark.own_process  # that cluster in a process of its own (tests/own_process.py)
class TestTpuLikeSlices:
    def test_training_reserves_the_whole_tpu_like_slice_and_runs_on_its_worker_0(self, tpu_like_cluster, tmp_path,
                                                                                 shards_dir, tiny_tokenizer_dir,
                                                                                 small_corpus):
        """Nodes that look like a v4-8 host and a two-host v4-16 slice: each run lands on its slice's
        worker 0 with the environment TensorFlow needs there, reserves every host of that slice, and
        releases them afterwards. Sharding actors on the same cluster stay off the TPU hosts."""
        import ray
        from ray.util.placement_group import placement_group_table

        from tpu_ray.train.launch import launch

        head, v4_16 = tpu_like_cluster.head, tpu_like_cluster.v4_16
        common = {"train.steps": 4, "train.log_every": 2, "train.eval_every": 4, "train.placement": "tpu",
                  "train.strategy": "cpu"}  # placed like a TPU job, trained on this CPU
        from tpu_ray.errors import UserError

        groups_before = dict(placement_group_table())
        with pytest.raises(UserError, match=r"^output_dir=.*: training on a TPU node on a 4-node Ray cluster "
                                            r"needs a directory every node can read"):
            launch(_cfg(tmp_path / "local", shards_dir, tiny_tokenizer_dir,
                              **common, **{"train.tpu_topology": "v4-8"}))
        assert placement_group_table() == groups_before  # refused before reserving anything
        common["ray.shared_filesystem"] = True  # every node of this test cluster is this machine
        # (A one-host v4-8 slice, its node and its environment: the run of the class's last test, which trains there.)
        # Two hosts, the slice named in the config: train.tpu_name picks the slice Ray reserves, and
        # TensorFlow's TPU_NAME is the reserved slice's name, one client, no libtpu.
        big = launch(_cfg(tmp_path / "b", shards_dir, tiny_tokenizer_dir,
                                **common, **{"train.tpu_topology": "v4-16", "train.tpu_name": "slice-b"}))
        assert big["node_id"] == v4_16[1].node_id  # worker 0
        assert big["slice_nodes"] == [v4_16[1].node_id, v4_16[0].node_id]
        assert big["steps"] == 4
        assert (tmp_path / "b" / "model" / "config.json").exists()  # exported into the shared local run dir
        assert big["tpu_env"] == {"TPU_NAME": "slice-b", "TPU_LOAD_LIBRARY": "0", "TPU_ACCELERATOR_TYPE": "v4-16"}
        assert all(pg["state"] == "REMOVED" for pg in placement_group_table().values())

        # Sharding actors: only the CPU head may run them, though every TPU host has a free CPU.
        from tpu_ray.prepare.shards import make_shards
        from tpu_ray.pipeline import shard_job

        shard_cfg = tiny_config(tmp_path / "s", small_corpus, **{"tokenizer.path": tiny_tokenizer_dir,
                                                                  "ray.shared_filesystem": True})
        seen: set[str] = set()
        summary = make_shards(shard_job(shard_cfg), actors=3,
                              on_unit_done=lambda n, pool: seen.update(ray.get([a.node_id.remote() for a in pool])))
        assert summary.units >= 3 and seen == {head.node_id}

    def test_worker_1_joining_after_worker_0_is_reserved_and_tpu_name_picks_the_slice(self, tpu_like_cluster):
        """Two more v4-16 slices' worker 0 are up; train.tpu_name=slice-e must reserve slice-e (not
        whichever head Ray picks). Worker 1 of slice-e joins only after worker 0's head resource is
        placed: the reservation still ends with both hosts (the pod type says 2) and the multi-host
        environment naming slice-e. Slice-d never gets its worker 1: the refusal names the missing
        worker id. Reservation only, no training (on this class's cluster: it had one of its own)."""
        import threading

        from ray.util.placement_group import placement_group_table

        from tpu_ray.cluster.placement import reserve_tpu_slice
        from tpu_ray.errors import FailureKind, UserError

        cluster = tpu_like_cluster.cluster
        slice_d = _tpu_host(cluster, "v4-16", "slice-d", 0, cpus=0)  # first: a bare pick could land here
        slice_e0 = _tpu_host(cluster, "v4-16", "slice-e", 0, cpus=0)
        added = [slice_d, slice_e0]
        try:
            outcome: dict = {}

            def reserve() -> None:
                try:
                    outcome["reservation"] = reserve_tpu_slice("TPU-v4-16-head", 300, tpu_name="slice-e")
                except BaseException as exc:  # reported by the assertions below
                    outcome["error"] = exc

            thread = threading.Thread(target=reserve, daemon=True)  # never holds the worker open
            thread.start()

            def head_placed_on() -> set[str]:
                return {node for pg in placement_group_table().values() if pg["state"] == "CREATED"
                        for b, node in pg["bundles_to_node_id"].items() if "TPU-v4-16-head" in pg["bundles"][b]}

            deadline = time.monotonic() + 300
            while not head_placed_on() and thread.is_alive():
                assert time.monotonic() < deadline, placement_group_table()
                time.sleep(0.2)
            assert head_placed_on() == {slice_e0.node_id}, (head_placed_on(), outcome)
            assert "reservation" not in outcome  # still waiting for the host that is not there yet
            slice_e1 = _tpu_host(cluster, "v4-16", "slice-e", 1, cpus=0)
            added.append(slice_e1)
            thread.join(timeout=300)
            assert "error" not in outcome, outcome
            reservation = outcome["reservation"]
            reserved = reservation.slice
            assert reserved.name == "slice-e" and reserved.pod_type == "v4-16"
            assert reserved.hosts == (slice_e0.node_id, slice_e1.node_id)  # worker 0 first, both reserved
            env = reserved.client_env()
            assert (env["TPU_NAME"], env["TPU_LOAD_LIBRARY"]) == ("slice-e", "0")
            reservation.release()

            with pytest.raises(UserError) as refused:
                reserve_tpu_slice("TPU-v4-16-head", 5, tpu_name="slice-d")
            assert refused.value.kind is FailureKind.NO_CAPACITY
            line = str(refused.value)
            assert "TPU slice slice-d (v4-16, 2 hosts): worker id(s) 1 not in the Ray cluster" in line, line
            assert "\n" not in line
            assert slice_d.node_id  # its head was reserved and given back: nothing is left held
            assert all(pg["state"] == "REMOVED" for pg in placement_group_table().values())
        finally:
            for node in added:  # the class's cluster as the next test expects it
                cluster.remove_node(node)

    def test_losing_the_training_slice_resumes_on_the_other_one_by_itself(self, tpu_like_cluster, tmp_path, shards_dir,
                                                                          tiny_tokenizer_dir):
        """Two single-host v4-8-like slices: after the run's first committed checkpoint the node that
        trains is removed; the run reserves the other slice, resumes from that checkpoint, ends at the
        final step, and the metrics show one node_lost and the step it resumed from. Each attempt runs
        on its one-host slice's worker 0 with TensorFlow's PJRT environment, reserving that host only,
        and releases it afterwards (this run is also the first test's one-host v4-8 case)."""
        import threading

        from ray.util.placement_group import placement_group_table

        from tpu_ray.train.launch import launch

        cluster = tpu_like_cluster.cluster  # the last test of the class: it removes a node
        second = _tpu_host(cluster, "v4-8", "slice-c", 0)  # the other single-host slice
        hosts = {h.node_id: h for h in (tpu_like_cluster.v4_8, second)}
        run_dir = tmp_path / "run"
        # The node goes as soon as ckpt-5 is committed: ~95 steps (seconds) are left to remove it in.
        steps, every = 100, 5
        cfg = _cfg(run_dir, shards_dir, tiny_tokenizer_dir,
                   **{"train.steps": steps, "train.checkpoint_every": every, "train.log_every": every,
                      "train.eval_every": 1000, "train.placement": "tpu", "train.strategy": "cpu",
                      "train.tpu_topology": "v4-8", "ray.shared_filesystem": True})
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["summary"] = launch(cfg)
            except BaseException as exc:  # reported by the assertion below
                outcome["error"] = exc

        thread = threading.Thread(target=run, daemon=True)  # never holds the worker open
        thread.start()

        def training_nodes() -> set[str]:  # where the slice's head bundle (the TF client) is
            return {node for pg in placement_group_table().values() if pg["state"] == "CREATED"
                    for b, node in pg["bundles_to_node_id"].items() if "TPU-v4-8-head" in pg["bundles"][b]}

        # The slice is reserved before training starts: looked up first, so that its node goes the
        # moment the first checkpoint is committed.
        deadline = time.monotonic() + 300
        while len(training_nodes()) != 1:
            assert thread.is_alive(), f"training ended before its slice was seen: {outcome}"
            assert time.monotonic() < deadline, placement_group_table()
            time.sleep(0.5)
        victim = training_nodes().pop()
        while not (run_dir / "checkpoints" / "checkpoint").exists():
            assert thread.is_alive(), f"training ended before its first checkpoint: {outcome}"
            assert time.monotonic() < deadline, "no committed checkpoint within 300 s"
            time.sleep(0.2)
        cluster.remove_node(hosts[victim], allow_graceful=False)
        thread.join(timeout=600)
        assert not thread.is_alive() and "error" not in outcome, outcome
        summary = outcome["summary"]
        assert summary["steps"] == steps and summary["failures"] == 1 and summary["node_id"] != victim
        assert summary["node_id"] in hosts and summary["slice_nodes"] == [summary["node_id"]]  # the v4-8 host
        # One host: TensorFlow's PJRT TPU client, set in the task's runtime_env (no login shell).
        assert summary["tpu_env"] == {"PJRT_DEVICE": "TPU", "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
                                      "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so",
                                      "TPU_ACCELERATOR_TYPE": "v4-8"}
        assert all(pg["state"] == "REMOVED" for pg in placement_group_table().values())  # released
        events = _records(run_dir, "event")
        lost = [e for e in events if e["event"] == "node_lost"]
        assert len(lost) == 1 and lost[0]["last_checkpoint_step"] >= every and lost[0]["lost_s"] >= 0
        back = [e for e in events if e["event"] == "resumed_after_failure"]
        assert len(back) == 1 and back[0]["step"] == lost[0]["last_checkpoint_step"]
        assert back[0]["node_id"] == summary["node_id"]
        resumed = [e for e in events if e["event"] == "resume"]
        assert [e["step"] for e in resumed] == [lost[0]["last_checkpoint_step"]]
        assert resumed[0]["samples"] == resumed[0]["step"] * cfg.train.batch_size  # no sample skipped or repeated


@pytest.mark.slow  # 4 Ray nodes, two TF workers started twice: a few minutes on 2 cores
@pytest.mark.own_process  # that cluster in a process of its own (tests/own_process.py)
def test_losing_a_multiworker_node_resumes_every_worker_from_the_chiefs_gs_checkpoint(gcs_emulator, tmp_path, shards_dir,
                                                                                     tiny_tokenizer_dir, monkeypatch):
    """Two Ray Train workers (MultiWorkerMirroredStrategy) on three 1-CPU nodes, the multi-node layout:
    a shared gs:// run directory (emulator). After the first committed checkpoint the node of one
    worker is removed; the run starts the worker group again on the nodes left, every worker resumes
    from the chief's checkpoint in gs, the run ends at the final step in sync, each worker having read
    its own equal share of the records, and the metrics stream records node_lost and
    resumed_after_failure as the TPU path does. The chief uploads checkpoints, the export and Ray
    Train's bookkeeping to the run; a run directory on this machine only is refused there. (One launch
    for what two tests launched three times: a Ray Train launch costs over a minute of start-up on 2
    cores, its steps a fraction of a second.)"""
    import threading

    import ray
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    from tpu_ray import storage
    from tpu_ray.errors import UserError
    from tpu_ray.train.launch import launch

    run = f"{gcs_emulator.make_bucket()}/run"
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster()
    try:
        cluster.add_node(num_cpus=0)  # the head: the driver and Ray Train's controller
        nodes = {n.node_id: n for n in (cluster.add_node(num_cpus=1) for _ in range(3))}
        ray.init(address=cluster.address, log_to_driver=False)
        # The node goes as soon as ckpt-5 is committed: ~95 multi-worker steps are left to remove it in.
        steps, every = 100, 5
        cfg = _cfg(tmp_path / "unused", shards_dir, tiny_tokenizer_dir,
                   **{"train.steps": steps, "train.checkpoint_every": every, "train.log_every": every,
                      "train.eval_every": 1000, "train.workers": 2, "train.workers_network_closed": True}
                   ).override({"output_dir": run})
        # A run directory on this machine only, not declared shared, is refused on a multi-node cluster
        # before any worker starts: every worker resumes from the chief's checkpoints there.
        with pytest.raises(UserError, match=r"^output_dir='.*/local': train.workers=2 on a 4-node Ray cluster "
                                            r"needs a run directory every node can read"):
            launch(cfg.override({"output_dir": str(tmp_path / "local")}))
        # Declared shared (ray.shared_filesystem: every node of this test cluster is this machine), the
        # same directory passes that check (the launch into it: the multi-worker node-loss test, since
        # merged with this one; the chief-only export is asserted on gs below).
        from tpu_ray.cluster.multiworker import _check_shared_run_dir

        _check_shared_run_dir(str(tmp_path / "local"), cfg.train.workers, shared_filesystem=True)
        outcome: dict = {}

        def run_training() -> None:
            try:
                outcome["summary"] = launch(cfg)
            except BaseException as exc:  # reported by the assertion below
                outcome["error"] = exc

        thread = threading.Thread(target=run_training, daemon=True)  # never holds the worker open
        thread.start()
        monkeypatch.delenv("RAY_ADDRESS", raising=False)  # Ray's state API lets it override the address

        def worker_nodes() -> list[str]:
            return [a.node_id for a in list_actors(address=cluster.address, filters=[("state", "=", "ALIVE")],
                                                   limit=1000)
                    if "TrainWorker" in a.class_name and a.node_id in nodes]

        # Where the workers run is looked up while they start (a state-API query takes seconds on a busy
        # machine), so that the node goes the moment the first checkpoint is committed.
        deadline = time.monotonic() + 400
        workers = worker_nodes()
        while len(workers) < 2:
            assert thread.is_alive(), f"training ended before its workers were seen: {outcome}"
            assert time.monotonic() < deadline, f"no two Ray Train workers within 400 s: {workers}"
            time.sleep(0.5)
            workers = worker_nodes()
        assert len(workers) == 2, workers
        while not storage.exists(f"{run}/checkpoints/checkpoint"):
            assert thread.is_alive(), f"training ended before its first checkpoint: {outcome}"
            assert time.monotonic() < deadline, "no committed checkpoint within 400 s"
            time.sleep(0.2)
        cluster.remove_node(nodes[workers[0]], allow_graceful=False)
        thread.join(timeout=900)
        assert not thread.is_alive() and "error" not in outcome, outcome
        summary = outcome["summary"]
        assert summary["failures"] == 1
        workers = summary["workers"]  # what each worker of the resumed group read and ended with
        assert len(workers) == 2 and [w["steps"] for w in workers] == [steps, steps]
        assert workers[0]["weights_sha256"] == workers[1]["weights_sha256"]  # both resumed from the chief's ckpt
        events = [e for e in _gs_records(run) if e.get("kind") == "event"]
        lost = [e for e in events if e["event"] == "node_lost"]
        assert len(lost) == 1 and lost[0]["failure_kind"] == "lost_capacity" and lost[0]["last_checkpoint_step"] >= every
        back = [e for e in events if e["event"] == "resumed_after_failure"]
        assert len(back) == 1 and back[0]["step"] == lost[0]["last_checkpoint_step"] and back[0]["workers"] == 2
        resumed = [e for e in events if e["event"] == "resume"]
        assert [e["step"] for e in resumed] == [lost[0]["last_checkpoint_step"]]
        assert resumed[0]["checkpoint"] == f"{run}/checkpoints/ckpt-{int(lost[0]['last_checkpoint_step'])}"  # in gs

        # Each worker read its own equal share of the records (the resumed group's shares: a worker's
        # share does not depend on the step it starts at), together all of them.
        counts = {str(p): int(p.stem.rsplit("-", 1)[1]) for p in shards_dir.glob("train-*.tfrecord")}

        def records(entry: str) -> set[tuple[str, int]]:  # "path" (whole file) or "path[a:b]" (part of it)
            path, _, span = entry.partition("[")
            a, b = map(int, span.rstrip("]").split(":")) if span else (0, counts[path])
            return {(path, i) for i in range(a, b)}

        read = [set().union(*map(records, w["files_read"])) for w in workers]
        assert read[0] and read[1] and not read[0] & read[1]  # each worker reads its own records
        assert len(read[0]) - len(read[1]) in (-1, 0, 1)  # equal shares, whatever the files' sizes
        assert read[0] | read[1] == {(f, i) for f, n in counts.items() for i in range(n)}
        assert storage.exists(f"{run}/model/config.json")  # the chief exported into the gs run dir
        assert f'model_checkpoint_path: "ckpt-{steps}"' in storage.read_text(f"{run}/checkpoints/checkpoint")
        assert storage.glob(f"{run}/ray_train/*")  # Ray Train's bookkeeping beside the run, not in /tmp
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow  # two Ray Train launches: about 1.5 minutes on 2 cores
def test_multiworker_runs_one_after_another_in_one_process_hear_every_new_actor(tmp_path, small_corpus,
                                                                                tiny_tokenizer_dir, ray_local):
    """Ray Train's fit() runs in a process of its own, never the caller's (cluster/multiworker.py): in
    one Python process, two multi-worker pipelines one after the other each get every shard actor's
    answer without a stall, and a new actor answers after each. (A driver that had run fit() itself
    stopped hearing new actors once the TrainController was collected: docs/testing.md.) A recovery
    retry is the same launch again (test_losing_a_multiworker_node_resumes_every_worker_...).
    The second pipeline's batch (15) does not divide over its 2 replicas: the user error raised inside
    a Ray Train worker reaches the caller as one line, and the driver still hears new actors after a
    failed fit() (one launch for what a test of its own launched again, over 20 s on 2 cores)."""
    import ray

    from tpu_ray.errors import UserError
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.prepare.actor_pool import STALL_S

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self) -> str:
            return "pong"

    def a_new_actor_answers() -> None:
        actor = Echo.remote()
        assert ray.get(actor.ping.remote(), timeout=60) == "pong"
        ray.kill(actor)

    common = {"tokenizer.path": tiny_tokenizer_dir, "train.workers": 2, "train.workers_network_closed": True,
              "train.eval_every": 1000, "train.steps": 4, "train.checkpoint_every": 4, "train.log_every": 2}
    result = Pipeline(tiny_config(tmp_path / "first", small_corpus, **common)).run()
    # A deaf driver waits STALL_S for its first shard unit, then replaces actors that never answer.
    assert result.shard_summary["units"] >= 2 and result.shard_summary["seconds"] < STALL_S
    assert [w["steps"] for w in result.train_summary["workers"]] == [4, 4]
    a_new_actor_answers()

    second = tiny_config(tmp_path / "second", small_corpus, **common, **{"train.batch_size": 15})
    with pytest.raises(UserError, match=r"^train.batch_size=15 is not divisible by the 2 replicas") as err:
        Pipeline(second).run()
    assert "\n" not in str(err.value)
    shards = json.loads((tmp_path / "second" / "summary.json").read_text())["shards"]  # its stage before training
    assert shards["units"] >= 2 and shards["seconds"] < STALL_S
    a_new_actor_answers()


@pytest.mark.parametrize("layout, chips", [
    ({"dev/accel0": "", "dev/accel1": ""}, 2),                               # v2-v4: /dev/accel<N>
    ({"dev/accel/accel0": ""}, 0),                                           # NVIDIA 570+: a directory
    ({"dev/vfio/0": "", "dev/vfio/1": "", "dev/vfio/vfio": "",
      "iommu/0/devices/0000:00:04.0/vendor": "0x1ae0\n",
      "iommu/1/devices/0000:00:05.0/vendor": "0x1ae0\n"}, 2),               # v5e+: Google's VFIO groups
    ({"dev/vfio/96": "", "iommu/96/devices/0000:03:00.0/vendor": "0x15b3\n"}, 0),  # someone else's vfio device
    ({"dev/null": ""}, 0),
])
@pytest.mark.quick
def test_tpu_chips_are_found_as_ray_finds_them(tmp_path, layout, chips):
    from tpu_ray.train.strategy import local_tpu_chips

    for rel, text in layout.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert local_tpu_chips(str(tmp_path / "dev"), str(tmp_path / "iommu")) == chips


def test_the_seed_fixes_the_initial_weights(tmp_path, shards_dir, tiny_tokenizer_dir):
    import tensorflow as tf

    from tpu_ray.train.strategy import StrategyInfo
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.loop import build, weights_digest

    tok = tokenizer_info(tiny_tokenizer_dir)
    info = StrategyInfo(strategy=tf.distribute.get_strategy(), kind="cpu", replicas=1, device="cpu",
                        mixed_precision="float32", jit_compile=False, steps_per_execution=1)
    cfgs = [_cfg(tmp_path, shards_dir, tiny_tokenizer_dir, seed=seed) for seed in (1, 1, 2)]
    digests = [weights_digest(build(c.train, c.paths, c.seed, c.model_spec, info, tok).model) for c in cfgs]
    assert digests[0] == digests[1] != digests[2]


def _tokenizer_with_pad_at(out_dir: Path, order: tuple[str, ...]) -> str:
    """A word-level tokenizer directory whose special tokens come in `order` (ids 0..4), then words."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate((*order, *(f"w{i}" for i in range(795))))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    return str(out_dir)


def test_a_roberta_tokenizer_whose_pad_id_is_not_1_is_refused(tmp_path, shards_dir, capsys):
    """TF RoBERTa's position ids treat id 1 as padding: a tokenizer with <pad> at 3 (and [SEP] at 1)
    is refused with exit 2, naming the token and its id; BERT, which does not care, trains."""
    from tpu_ray.cli import main

    tok = _tokenizer_with_pad_at(tmp_path / "tok", ("[CLS]", "[SEP]", "<unk>", "<pad>", "[MASK]"))
    cfg = _cfg(tmp_path / "run", shards_dir, tok, **{"train.steps": 2, "train.eval_every": 2, "train.log_every": 2})
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(cfg.to_yaml())
    assert main(["train", "--config", str(cfg_path), "train.placement=local"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "pad token <pad> has id 3" in err and "treats id 1 as padding" in err, err
    from tpu_ray.train.loop import train

    assert train(cfg.override({"model.model_type": "bert", "output_dir": str(tmp_path / "bert")}))["steps"] == 2


def test_resume_under_another_schedule_is_refused_unless_extending(tmp_path, shards_dir, tiny_tokenizer_dir):
    from tpu_ray.errors import UserError
    from tpu_ray.train.loop import train

    over = {"train.steps": 10, "train.checkpoint_every": 10, "train.eval_every": 10, "train.log_every": 5}
    cfg = _cfg(tmp_path / "run", shards_dir, tiny_tokenizer_dir, **over)
    train(cfg)
    with pytest.raises(UserError, match=r"^--resume: .*ckpt-10 was trained with another schedule "
                                        r"\(train.steps 10 -> 20, train.learning_rate 0.001 -> 0.002\)") as err:
        train(cfg.override({"train.steps": 20, "train.learning_rate": 2e-3}), resume=True)
    assert "train.extend_schedule=true" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"warmup steps 2 -> 4"):
        train(cfg.override({"train.warmup_steps": 4}), resume=True)
    # The documented way to extend a run: say so, and the schedule is the new one from step 10 on.
    extended = train(cfg.override({"train.steps": 20, "train.extend_schedule": True}), resume=True)
    assert extended["resumed_from"] == 10 and extended["steps"] == 20


def test_train_step_is_the_keras_fit_step(tmp_path, shards_dir, tiny_tokenizer_dir):
    """tpu-ray's train step (masked positions only, global-count loss, hand-applied gradients) moves
    the weights exactly as transformers' own `model.fit` step does on the same batches from the same
    initial weights: the learning benchmark's comparison then differs only in data order and masks."""
    from tests.helpers import shard_files
    from tpu_ray.prepare.tokenizer import tokenizer_info
    from tpu_ray.train.inputs import train_dataset
    from tpu_ray.train.loop import build, make_train_step, mask_spec
    from tpu_ray.train.strategy import select

    cfg = _cfg(tmp_path / "run", shards_dir, tiny_tokenizer_dir, **{"model.dropout": 0.0})
    tok = tokenizer_info(cfg.tokenizer_dir)
    files = [p for p, _ in shard_files(str(shards_dir), "train")]
    it = iter(train_dataset(files, SEQ_LEN, 16, mask_spec(cfg.train, cfg.paths, tok), cfg.seed, 256))
    batches = [next(it) for _ in range(4)]
    info = select(cfg.train)

    ours = build(cfg.train, cfg.paths, cfg.seed, cfg.model_spec, info, tok)
    step, _ = make_train_step(ours)
    for batch in batches:
        step(batch)

    keras = build(cfg.train, cfg.paths, cfg.seed, cfg.model_spec, info, tok)  # the same seed: the same initial weights
    keras.model.compile(optimizer=keras.optimizer)
    for batch in batches:
        keras.model.train_on_batch({k: batch[k] for k in ("input_ids", "attention_mask", "labels")})

    def largest_difference(a, b) -> float:
        return max(float(np.abs(x.numpy() - y.numpy()).max())
                   for x, y in zip(a.model.trainable_variables, b.model.trainable_variables))

    assert int(ours.optimizer.iterations) == int(keras.optimizer.iterations) == 4
    assert largest_difference(ours, build(cfg.train, cfg.paths, cfg.seed, cfg.model_spec, info, tok)) > 1e-3  # the steps did change the weights
    difference = largest_difference(ours, keras)
    assert difference < 1e-5, difference


def test_an_interrupted_first_checkpoint_starts_at_step_0_and_says_so(tmp_path, shards_dir, tiny_tokenizer_dir,
                                                                      caplog):
    """The process died after the first checkpoint's position and data files, before its
    index: nothing was ever committed. `--resume` (what recovery runs) used to refuse ("delete ... to
    start over"), which stopped automatic recovery; now it starts at step 0 with a warning and a
    `start_over` event, and the half-written files are gone. A fresh start over it is not refused
    either: there was nothing to lose."""
    from tpu_ray.train.loop import train

    cfg = _cfg(tmp_path / "run", shards_dir, tiny_tokenizer_dir,
               **{"train.steps": 4, "train.checkpoint_every": 4, "train.eval_every": 4, "train.log_every": 2})
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "ckpt-2.position.json").write_text('{"step": 2}\n')
    (ckpts / "ckpt-2.data-00000-of-00002").write_bytes(b"\0" * 64)  # a data-file count unlike the new one's
    with caplog.at_level("WARNING"):
        summary = train(cfg, resume=True)
    assert summary["steps"] == 4 and not summary.get("resumed_from")
    assert any("no checkpoint was ever completed (ckpt-2 was interrupted" in r.getMessage() for r in caplog.records)
    assert [r["reason"] for r in _events(tmp_path / "run", "start_over")][0].endswith("training starts at step 0")
    assert not list(ckpts.glob("ckpt-2.*")) and (ckpts / "ckpt-4.index").exists()


def _events(run_dir: Path, name: str) -> list[dict]:
    return [r for r in _records(run_dir, "event") if r.get("event") == name]


def test_weight_decay_0_trains_with_the_same_optimizer_class(tmp_path, shards_dir, tiny_tokenizer_dir):
    """train.weight_decay=0 once crashed (transformers' create_optimizer returns another class
    at rate 0, without `_create_all_weights`). Every valid value trains, with one optimizer class."""
    from transformers import AdamWeightDecay

    from tpu_ray.train import schedule
    from tpu_ray.train.loop import train
    from tpu_ray.train.optimizer import make_optimizer

    cfg = _cfg(tmp_path / "run", shards_dir, tiny_tokenizer_dir,
               **{"train.steps": 2, "train.checkpoint_every": 2, "train.eval_every": 2, "train.log_every": 1,
                  "train.weight_decay": 0.0})
    assert isinstance(make_optimizer(schedule.from_train(cfg.train), cfg.train.weight_decay)[0], AdamWeightDecay)
    summary = train(cfg)
    assert summary["steps"] == 2 and np.isfinite(_records(tmp_path / "run", "train")[-1]["loss"])
