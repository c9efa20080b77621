"""Sharding throughput: tpu-ray's `make_shards` against the reference workflow and the tokenizer alone.

One run measures, on the same corpus (WikiText-2 repeated to `--mb` MB) and the same Unigram
tokenizer (vocab 10k, trained with tpu_ray.prepare.tokenizer):

1. ceiling (`vs_ceiling`, the issue's yardstick): `tokenizers`' own `encode_batch` over the corpus
   lines already in memory, in one process on all cores (its own threads), 50,000-line slices, no
   I/O, no chunking, no writing. What a user calling the tokenizer directly would get; not an upper
   bound for tpu-ray (its actors call encode_batch_fast on smaller batches, which costs less CPU);
2. reference: the Hugging Face TPU example's workflow re-done in a subprocess: `load_dataset("text")`,
   `.map(tokenizer, batched=True, num_proc=<cores>)`, `group_texts` by list concatenation, one
   `tf.train.Example` per sample serialized in Python, `tf.io.TFRecordWriter`;
3. tpu-ray: `make_shards` on a local Ray cluster (start-up, including its worker processes, not
   counted), end to end: planning, tokenizing (one read per unit), shards and manifest; and the
   same with Ray's start-up counted (`e2e_*`), which is what a user waits for.

Every rate divides the SAME token count (the corpus' tokens without special tokens, as the
ceiling counts them) by that method's seconds, so the ratios compare time for the same work.
The last line printed is one JSON object with the figures and the ratios.

    python benchmarks/shard_throughput.py --mb 20
    python benchmarks/shard_throughput.py --mb 100 --skip-reference   # memory as the corpus grows
    python benchmarks/shard_throughput.py --mb 20 --nodes 2           # same bytes on 2 nodes
    python benchmarks/shard_throughput.py --mb 200 --skip-reference --format txt,jsonl.gz,jsonl.zst,parquet,hf-disk

--format: the same text in the shapes real corpora ship in (C4-like .jsonl.gz files, Pile-like
.jsonl.zst, FineWeb-like parquet with row groups and extra columns, a save_to_disk dataset), one
record per line of the corpus, each sharded by make_shards; per format: tokens/s, its ratio to
plain text's, peak actor RSS, bytes the actors read (/proc rchar) over
the bytes stored, storage requests (tpu_ray.storage calls of the driver and the actors), the actors'
CPU seconds per million tokens (/proc of the actor processes, read from outside: see ActorCpu). And the upper bound, `txt_vs_ceiling`: plain text against N fresh
processes (N = the actors, one per CPU by default), started together, each running exactly the
actors' tokenizer calls (`encode_lines` on `_batches` of the lines, the actors' environment from
`actor_env`) over 1/N of the corpus, with reading, the tokenizer's loading and everything else
outside the timing (see `ceiling_child`). The ceiling's CPU seconds per million tokens against the actors'
(`txt_cpu_vs_ceiling`) is the cost of everything that is not tokenization, a figure the machine's
load moves much less than the wall-clock ratio.

Why not the earlier N-process ceiling (forked from this process, `encode_batch_fast` over
50,000-line slices): a slice's encodings, hundreds of MB alive at once, cost ~20% more CPU per token
than the actors' batches (2,048 lines / 1 MiB: one process, 50 MB, 0.97-1.06 against 0.82-0.87
CPU-s per M tokens; 2x the RSS, ~100k page faults against none), more than the actors spend on
tokenizing and everything else, so tpu-ray measured 1.17x that "ceiling". Forking instead of fresh
processes, the thread settings and the token count made no difference measured.

Under load from other processes the wall-clock ratios move with the scheduler, not the work (the
ceiling's two CPU-bound processes were seen queued on one CPU for 40-75% of the time while others
ran on the other), so there compare the CPU figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks._common import build_corpus, train_benchmark_tokenizer  # noqa: E402


def corpus_lines(path: Path) -> list[str]:
    """The lines tpu-ray tokenizes (stripped, empty ones skipped), read outside any timing."""
    text = path.read_text(encoding="utf-8")
    return [s for s in (line.strip() for line in text.split("\n")) if s]


_BATCH_LINES = 50_000  # encode in slices: a whole 1 GB corpus's encodings would not fit in memory


def measure_ceiling(tokenizer_dir: str, lines: list[str]) -> dict:
    """`encode_batch` on all cores over in-memory lines; also the offsets-free `encode_batch_fast`.
    In slices of _BATCH_LINES lines (each slice's encodings freed before the next), timed in sum."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    seconds = fast_seconds = 0.0
    tokens = 0
    for i in range(0, len(lines), _BATCH_LINES):
        part = lines[i:i + _BATCH_LINES]
        t0 = time.perf_counter()
        encodings = tok.encode_batch(part, add_special_tokens=False)
        seconds += time.perf_counter() - t0
        tokens += sum(len(e.ids) for e in encodings)
        del encodings
        t0 = time.perf_counter()
        tok.encode_batch_fast(part, add_special_tokens=False)
        fast_seconds += time.perf_counter() - t0
    return {"seconds": seconds, "tokens": tokens, "fast_seconds": fast_seconds}


# --------------------------------------------------------------------------------------------
# The reference workflow (runs in a child process: it imports TensorFlow and forks map workers)
# --------------------------------------------------------------------------------------------
def reference_child(corpus: str, tokenizer_dir: str, out_dir: str, procs: int, seq_len: int,
                    shard_size: int) -> dict:
    """The HF TPU example's prepare_tfrecord_shards workflow, on a local text file."""
    import datasets
    import tensorflow as tf
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)

    def tokenize_function(examples: dict) -> dict:
        return tokenizer(examples["text"])

    def group_texts(examples: dict) -> dict:
        concatenated = {k: sum(examples[k], []) for k in examples}  # as the reference does
        total = len(concatenated["input_ids"]) // seq_len * seq_len
        return {k: [t[i:i + seq_len] for i in range(0, total, seq_len)] for k, t in concatenated.items()}

    def serialize(snapshot: dict) -> list[bytes]:
        records = []
        for i in range(len(snapshot["input_ids"])):
            feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=snapshot[k][i]))
                       for k in ("input_ids", "attention_mask")}
            records.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        return records

    t0 = time.perf_counter()
    ds = datasets.load_dataset("text", data_files=corpus, split="train", cache_dir=os.path.join(out_dir, "cache"))
    tokenized = ds.map(tokenize_function, batched=True, num_proc=procs, remove_columns=["text"])
    grouped = tokenized.map(group_texts, batched=True, batch_size=1000, num_proc=procs)
    samples = 0
    for count, start in enumerate(range(0, len(grouped), shard_size)):
        snapshot = grouped[start:start + shard_size]
        n = len(snapshot["input_ids"])
        records = serialize(snapshot)
        with tf.io.TFRecordWriter(os.path.join(out_dir, f"dataset-{count}-{n}.tfrecord")) as writer:
            for record in records:
                writer.write(record)
        samples += n
    seconds = time.perf_counter() - t0
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return {"seconds": seconds, "samples": samples, "peak_rss_bytes": peak * 1024}


def measure_reference(corpus: Path, tokenizer_dir: str, work: Path, procs: int, seq_len: int) -> dict:
    out = work / "reference"
    shutil.rmtree(out, ignore_errors=True)  # a fresh datasets cache too: no cache hits across repeats
    out.mkdir(parents=True)
    cmd = [sys.executable, __file__, "--reference-child", str(corpus), tokenizer_dir, str(out), str(procs),
           str(seq_len)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"reference run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------
# tpu-ray
# --------------------------------------------------------------------------------------------
def shard_config(work: Path, corpus: Path, tokenizer_dir: str, name: str, seq_len: int, unit_mb: float):
    from tpu_ray.config import RunConfig

    return RunConfig.from_dict({
        "name": "bench", "output_dir": str(work / name),
        "corpus": {"source": str(corpus)},
        "tokenizer": {"path": tokenizer_dir, "vocab_size": 10_000},
        "shard": {"seq_len": seq_len, "unit_bytes": int(unit_mb * 2**20)},
        "ray": {"shared_filesystem": True},  # --nodes N: every node of a local Cluster is this machine
    })


def _raylet_pids(nodes: list) -> set[int]:
    from ray._private import ray_constants

    return {p.process.pid for node in nodes for p in node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET, [])}


def _idle_workers(raylets: set[int]) -> int:
    """Ray's prestarted worker processes (titled ray::IDLE) that our own raylets started."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                idle = f.read().startswith(b"ray::IDLE")
        except (OSError, ValueError, IndexError):
            continue
        count += idle and ppid in raylets
    return count


def wait_for_workers(nodes: list, count: int, timeout_s: float = 60.0) -> float:
    """Wait until Ray's prestarted workers are up: that is Ray's start-up, not sharding's.

    (Running warm-up tasks instead would not do: actors never reuse a worker that ran tasks.)
    """
    t0 = time.perf_counter()
    raylets = _raylet_pids(nodes)
    while _idle_workers(raylets) < count and time.perf_counter() - t0 < timeout_s:
        time.sleep(0.1)
    return time.perf_counter() - t0


def _cpu_seconds(pid: int) -> float | None:
    """User+system CPU seconds of a live process (/proc/<pid>/stat), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ActorCpu:
    """CPU seconds of the sharding actors, read from outside while make_shards runs.

    The actors are Ray worker processes, children of our raylets, titled `ray::ShardWorker`.
    make_shards kills them when it returns, so a thread samples /proc/<pid>/stat of the raylets'
    children every `period` s and keeps each one's last reading; an actor's CPU is its last reading
    less its reading before make_shards (0 for a worker started during the run: its start-up counts).
    What a sample can miss is an actor's CPU after its last sample: < `period` s each, and idle
    time by then (its last unit is done before the driver kills it).
    """

    def __init__(self, raylets: set[int], period: float = 0.05):
        import threading

        self.raylets, self.period = raylets, period
        self.before = {pid: cpu for pid in self._children() if (cpu := _cpu_seconds(pid)) is not None}
        self.last = dict(self.before)
        self.actors: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _children(self) -> set[int]:
        pids: set[int] = set()
        for raylet in self.raylets:
            try:
                for tid in os.listdir(f"/proc/{raylet}/task"):
                    with open(f"/proc/{raylet}/task/{tid}/children") as f:
                        pids.update(map(int, f.read().split()))
            except OSError:
                continue
        return pids

    def _find_actors(self) -> None:
        for pid in self._children() - self.actors:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().startswith(b"ray::ShardWorker"):
                        self.actors.add(pid)
            except OSError:
                continue

    def _sample(self) -> None:
        for pid in self.actors:
            if (cpu := _cpu_seconds(pid)) is not None:
                self.last[pid] = cpu

    def _run(self) -> None:
        polls = 0
        while not self._stop.wait(self.period):
            if polls % 10 == 0:  # actors appear at the start (and on a retry): look for them now and then
                self._find_actors()
            self._sample()
            polls += 1

    def __enter__(self) -> "ActorCpu":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._sample()  # at once: make_shards has just asked Ray to kill the actors
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.last[pid] - self.before.get(pid, 0.0) for pid in self.actors if pid in self.last)


def measure_tpu_ray(cfg, actors: int | None, cpus: int, nodes: int) -> dict:
    """make_shards on a fresh local cluster of `nodes` nodes sharing `cpus` CPUs."""
    import ray

    from tpu_ray.prepare.shards import make_shards
    from tpu_ray.pipeline import shard_job

    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    cluster = None
    t0 = time.perf_counter()
    if nodes == 1:
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        ray_nodes = [ray._private.worker._global_node]
    else:
        from ray.cluster_utils import Cluster

        per_node = max(1, cpus // nodes)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": per_node, "include_dashboard": False})
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=per_node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        ray_nodes = cluster.list_all_nodes()
    start_up = time.perf_counter() - t0
    # Only a head node prestarts workers: on several nodes, wait a little, not for all of them.
    start_up += wait_for_workers(ray_nodes, int(ray.cluster_resources().get("CPU", 1)), 60.0 if nodes == 1 else 10.0)
    cpu = ActorCpu(_raylet_pids(ray_nodes))
    driver0 = os.times()
    try:
        with cpu:
            summary = make_shards(shard_job(cfg), actors=actors)
        driver1 = os.times()
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    return {"seconds": summary.seconds, "samples": summary.samples, "shards": summary.shards,
            "units": summary.units, "actors": summary.actors, "tokens_with_sep": summary.tokens,
            "dropped": summary.dropped_tokens, "peak_actor_rss_bytes": summary.peak_actor_rss_bytes,
            "ray_start_s": start_up, "digest": digest_dir(Path(cfg.shards_dir)), "read_bytes": summary.read_bytes,
            "requests": summary.requests, "actor_cpu_s": cpu.seconds, "actor_pids": len(cpu.actors),
            "driver_cpu_s": driver1.user - driver0.user + driver1.system - driver0.system}


def digest_dir(d: Path) -> str:
    """One hash over every file's name and bytes (shards and manifest)."""
    h = hashlib.sha256()
    for p in sorted(d.iterdir()):
        if p.is_file():
            h.update(p.name.encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Formats (--format) and the N-process ceiling
# --------------------------------------------------------------------------------------------
FORMATS = ("txt", "jsonl.gz", "jsonl.zst", "parquet", "hf-disk")
FORMAT_FILES = 8  # files per file format: a compressed file is one work unit, so several keep actors busy


def write_format(fmt: str, corpus: Path, lines: list[str], out: Path) -> tuple[str, int]:
    """The corpus's lines as `fmt` under `out`; returns (corpus.source, bytes stored)."""
    import gzip

    if fmt == "txt":
        return str(corpus), corpus.stat().st_size
    out.mkdir(parents=True, exist_ok=True)
    parts = [lines[i::FORMAT_FILES] for i in range(FORMAT_FILES)] if fmt != "hf-disk" else [lines]
    if fmt in ("jsonl.gz", "jsonl.zst"):
        import zstandard

        for i, part in enumerate(parts):
            data = "".join(json.dumps({"text": t, "url": "https://example.org", "meta": {"i": i}}) + "\n"
                           for t in part).encode()
            path = out / f"part-{i:05d}.{fmt}"
            if fmt == "jsonl.gz":
                path.write_bytes(gzip.compress(data, compresslevel=6))
            else:
                path.write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
        source = str(out / f"*.{fmt}")
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        for i, part in enumerate(parts):
            table = pa.table({"text": part, "id": [f"<urn:{i}:{j}>" for j in range(len(part))],
                              "language_score": [0.9] * len(part)})
            pq.write_table(table, out / f"part-{i:05d}.parquet", row_group_size=5000)
        source = str(out / "*.parquet")
    elif fmt == "hf-disk":
        import datasets

        datasets.disable_progress_bars()
        datasets.Dataset.from_dict({"text": lines, "id": list(range(len(lines)))}).save_to_disk(str(out / "saved"))
        source = str(out / "saved")
    else:
        sys.exit(f"--format {fmt}: one of {', '.join(FORMATS)}")
    stored = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return source, stored


def line_ranges(path: Path, parts: int) -> list[tuple[int, int]]:
    """`parts` byte ranges of about equal size covering the file, each ending after a newline."""
    size = path.stat().st_size
    cuts = [0]
    with open(path, "rb") as f:
        for k in range(1, parts):
            f.seek(max(cuts[-1], size * k // parts))
            f.readline()  # to the end of the line the cut falls in
            cuts.append(min(f.tell(), size))
    cuts.append(size)
    return list(zip(cuts, cuts[1:]))


def ceiling_child(corpus: str, start: int, end: int, tokenizer_dir: str, max_line_bytes: int) -> None:
    """One process of the N-process ceiling (`--ceiling-child`): the actors' tokenization, nothing else.

    Its environment is the actors' (actor_env: the thread budget), set by the parent before this
    interpreter imports `tokenizers`. Outside the timing: reading its lines (one byte range of the
    corpus, cut into lines as the actors cut a unit), the tokenizer, the batches. Inside: exactly
    the tokenizer calls of an actor's `encode_joined`, i.e. `encode_lines` (encode_batch_fast,
    special-token strings respelled) on batches of ENCODE_BATCH_LINES / ENCODE_BATCH_CHARS, without
    the joining into one array. It starts when the parent says go, so that all N run at once.
    """
    from tpu_ray.prepare.lines import split_long_lines
    from tpu_ray.prepare.shards import _batches, encode_lines, never_text_ids, text_tokenizer
    from tpu_ray.prepare.streams import lines_of
    from tpu_ray.prepare.tokenizer import describe, load_tokenizer_json

    with open(corpus, "rb") as f:
        f.seek(start)
        lines = lines_of([f.read(end - start).decode("utf-8")])
    if max_line_bytes:
        lines, _ = split_long_lines(lines, max_line_bytes)
    tokenizer_json = load_tokenizer_json(tokenizer_dir)
    tok = text_tokenizer(tokenizer_json)
    special = never_text_ids(describe(tokenizer_json, tokenizer_dir))
    batches = list(_batches(lines))
    print("ready", flush=True)
    sys.stdin.readline()
    c0, t0 = os.times(), time.perf_counter()
    tokens = 0
    for batch in batches:
        tokens += sum(map(len, encode_lines(tok, batch, special)))
    t1, c1 = time.perf_counter(), os.times()
    print(json.dumps({"start": t0, "end": t1, "tokens": tokens,
                      "cpu_s": c1.user - c0.user + c1.system - c0.system}), flush=True)


def measure_process_ceiling(corpus: Path, tokenizer_dir: str, procs: int, threads: int,
                            max_line_bytes: int) -> dict:
    """N fresh processes, each the actors' tokenization (see ceiling_child) of 1/N of the corpus,
    all started together: seconds from the first start to the last end (CLOCK_MONOTONIC is one
    clock for all processes), tokens, and their CPU seconds (user+sys) summed."""
    from tpu_ray.prepare.shards import actor_env

    env = {**os.environ, **actor_env(threads)}
    children = [subprocess.Popen([sys.executable, __file__, "--ceiling-child", str(corpus), str(start), str(end),
                                  tokenizer_dir, str(max_line_bytes)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
                for start, end in line_ranges(corpus, procs)]
    try:
        for child in children:
            if child.stdout.readline().strip() != "ready":
                sys.exit(f"ceiling child failed (exit {child.wait()})")
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        results = [json.loads(child.stdout.readline()) for child in children]
    finally:
        for child in children:
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
    return {"seconds": max(r["end"] for r in results) - min(r["start"] for r in results),
            "tokens": sum(r["tokens"] for r in results), "cpu_s": sum(r["cpu_s"] for r in results)}


def measure_formats(args: argparse.Namespace, work: Path, corpus: Path, lines: list[str], tokenizer_dir: str,
                    tokens: int, txt: dict | None) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for fmt in args.format.split(","):
        source, stored = write_format(fmt, corpus, lines, work / "formats" / fmt)
        cfg = shard_config(work, Path(source), tokenizer_dir, f"fmt-{fmt}", args.seq_len, args.unit_mb)
        cfg = cfg.override({"corpus.source": source})
        r = txt if (fmt == "txt" and txt) else measure_tpu_ray(cfg, args.actors, args.cpus, 1)
        out[fmt] = {"tokens_per_s": round(tokens / r["seconds"]), "seconds": round(r["seconds"], 2),
                    "actor_cpu_s_per_mtok": round(r["actor_cpu_s"] / tokens * 1e6, 3),
                    "bytes_read_ratio": round(r["read_bytes"] / stored, 2), "requests": r["requests"],
                    "peak_actor_rss_mb": round(r["peak_actor_rss_bytes"] / 2**20), "stored_mb": round(stored / 1e6, 1),
                    "units": r["units"], "shards": r["shards"]}
    base = out.get("txt", {}).get("tokens_per_s")
    for entry in out.values():
        entry["vs_txt"] = round(entry["tokens_per_s"] / base, 2) if base else None
    return out


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["seconds"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=20.0, help="corpus size in MB (WikiText-2 repeated)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--unit-mb", type=float, default=1.0, help="shard.unit_bytes in MiB (work-unit size)")
    p.add_argument("--actors", type=int, default=None, help="default: the CPUs Ray sees")
    p.add_argument("--cpus", type=int, default=os.cpu_count(), help="CPUs of the local Ray cluster")
    p.add_argument("--nodes", type=int, default=1, help="also run on a ray.cluster_utils.Cluster of N nodes "
                                                         "and check the bytes equal the 1-node run")
    p.add_argument("--repeat", type=int, default=1, help="measure each method N times, keep the fastest")
    p.add_argument("--ceiling-runs", type=int, default=2, help="ceiling measurements per round (best kept); 1 for "
                   "GB-sized corpora")
    p.add_argument("--skip-reference", action="store_true", help="memory runs: no reference baseline")
    p.add_argument("--workdir", default=None, help="default: a temp dir, removed at the end")
    p.add_argument("--format", default=None, help=f"comma list of {','.join(FORMATS)}: also shard the same text "
                                                  f"in these formats (see the module docstring)")
    args = p.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="shard-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        run(args, work)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    corpus = build_corpus(work / "corpus" / "corpus.txt", args.mb)
    tokenizer_dir = train_benchmark_tokenizer(work / "tokenizer", 10_000, args.seq_len)
    lines = corpus_lines(corpus)
    cfg = shard_config(work, corpus, tokenizer_dir, "tpu-ray", args.seq_len, args.unit_mb)

    procs = args.actors or args.cpus  # the ceiling's processes: as many as make_shards' actors

    runs: dict[str, list[dict]] = {"ceiling": [], "reference": [], "tpu-ray": [], "process-ceiling": []}
    for _ in range(args.repeat):  # interleaved, so a burst of load on the machine hits all methods alike
        # The ceilings twice per round: their best is the strictest yardstick on a noisy machine.
        runs["ceiling"] += [measure_ceiling(tokenizer_dir, lines) for _ in range(args.ceiling_runs)]
        if args.format:
            runs["process-ceiling"] += [measure_process_ceiling(corpus, tokenizer_dir, procs,
                                                                cfg.shard.tokenizer_threads,
                                                                cfg.corpus.max_line_bytes)
                                        for _ in range(args.ceiling_runs)]
        if not args.skip_reference:
            runs["reference"].append(measure_reference(corpus, tokenizer_dir, work, args.cpus, args.seq_len))
        runs["tpu-ray"].append(measure_tpu_ray(cfg, args.actors, args.cpus, 1))
    ceiling, ours = best(runs["ceiling"]), best(runs["tpu-ray"])
    formats = process_ceiling = None
    if args.format:
        process_ceiling = best(runs["process-ceiling"])
        formats = measure_formats(args, work, corpus, lines, tokenizer_dir, ceiling["tokens"], ours)
    del lines
    reference = best(runs["reference"]) if runs["reference"] else None
    tokens = ceiling["tokens"]
    multi = None
    if args.nodes > 1:
        cfg_multi = shard_config(work, corpus, tokenizer_dir, f"tpu-ray-{args.nodes}-nodes", args.seq_len,
                                 args.unit_mb)
        multi = measure_tpu_ray(cfg_multi, args.actors, args.cpus, args.nodes)

    rate = {name: tokens / r["seconds"] for name, r in
            (("ceiling", ceiling), ("reference", reference), ("tpu-ray", ours)) if r}
    mb = 2**20
    print(f"\ncorpus {corpus.stat().st_size / 1e6:.1f} MB, {tokens:,} tokens (no special tokens), "
          f"seq_len {args.seq_len}, {args.cpus} CPUs, unit {args.unit_mb} MiB, best of {args.repeat} "
          f"(ceiling: of {args.ceiling_runs * args.repeat})")
    print(f"{'method':<44} {'seconds':>8} {'tokens/s':>12} {'vs ceiling':>10}  notes")
    fast_s = min(r["fast_seconds"] for r in runs["ceiling"])
    print(f"{'ceiling: encode_batch, all cores, no I/O':<44} {ceiling['seconds']:>8.2f} {rate['ceiling']:>12,.0f} "
          f"{1.0:>10.2f}  the issue's yardstick")
    print(f"{'  (encode_batch_fast, all cores, no I/O)':<44} {fast_s:>8.2f} {tokens / fast_s:>12,.0f} "
          f"{ceiling['seconds'] / fast_s:>10.2f}  no offsets; what tpu-ray's actors call")
    if reference:
        print(f"{'reference: datasets.map + tf.train.Example':<44} {reference['seconds']:>8.2f} "
              f"{rate['reference']:>12,.0f} {rate['reference'] / rate['ceiling']:>10.2f}  "
              f"{reference['samples']:,} samples, peak RSS {reference['peak_rss_bytes'] / mb:,.0f} MiB")
    print(f"{'tpu-ray: make_shards (1 node)':<44} {ours['seconds']:>8.2f} {rate['tpu-ray']:>12,.0f} "
          f"{rate['tpu-ray'] / rate['ceiling']:>10.2f}  {ours['samples']:,} samples, {ours['shards']} shards, "
          f"{ours['units']} units, {ours['actors']} actors, peak RSS/actor {ours['peak_actor_rss_bytes'] / mb:,.0f} MiB")
    print(f"{'':<44} {'':>8} {'':>12} {'':>10}  Ray start-up {ours['ray_start_s']:.1f} s not counted")
    actor_cpu = min(r["actor_cpu_s"] for r in runs["tpu-ray"])  # CPU seconds: load moves them much less
    print(f"{'':<44} {'':>8} {'':>12} {'':>10}  actors' CPU {actor_cpu:.1f} s = "
          f"{actor_cpu / tokens * 1e6:.3f} CPU-s per M tokens (/proc of {ours['actor_pids']} actor processes); "
          f"driver's CPU {ours['driver_cpu_s']:.1f} s")
    e2e_s = ours["seconds"] + ours["ray_start_s"]  # what a user waits: Ray's start-up counted
    print(f"{'tpu-ray: with Ray start-up counted':<44} {e2e_s:>8.2f} {tokens / e2e_s:>12,.0f} "
          f"{tokens / e2e_s / rate['ceiling']:>10.2f}  "
          + (f"vs reference {tokens / e2e_s / rate['reference']:.2f}" if reference else ""))
    same = None
    if multi:
        same = multi["digest"] == ours["digest"]
        print(f"{f'tpu-ray: make_shards ({args.nodes} nodes)':<44} {multi['seconds']:>8.2f} "
              f"{tokens / multi['seconds']:>12,.0f} {tokens / multi['seconds'] / rate['ceiling']:>10.2f}  "
              f"bytes identical to 1 node: {'YES' if same else 'NO'} (sha256 {multi['digest'][:12]}), "
              f"{multi['actors']} actors, one run, Ray start-up {multi['ray_start_s']:.1f} s not counted")
    result = {
        "tokens_per_s": round(rate["tpu-ray"]),
        "reference_tokens_per_s": round(rate["reference"]) if reference else None,
        "ceiling_tokens_per_s": round(rate["ceiling"]),
        "vs_reference": round(rate["tpu-ray"] / rate["reference"], 2) if reference else None,
        "ray_start_s": round(ours["ray_start_s"], 2),
        "e2e_tokens_per_s": round(tokens / e2e_s),
        "e2e_vs_reference": round(tokens / e2e_s / rate["reference"], 2) if reference else None,
        "vs_ceiling": round(rate["tpu-ray"] / rate["ceiling"], 2),
        "fast_ceiling_tokens_per_s": round(tokens / fast_s),
        "vs_fast_ceiling": round(rate["tpu-ray"] * fast_s / tokens, 2),
        "corpus_mb": round(corpus.stat().st_size / 1e6, 1),
        "peak_actor_rss_mb": round(ours["peak_actor_rss_bytes"] / mb),
        "actor_cpu_s_per_mtok": round(actor_cpu / tokens * 1e6, 3),
    }
    if multi:
        result["nodes_identical"] = same
    if formats:
        n_ceiling = tokens / process_ceiling["seconds"]
        ceiling_cpu = min(r["cpu_s"] for r in runs["process-ceiling"])
        print(f"\n{'format':<12} {'tokens/s':>12} {'vs txt':>7} {'read/stored':>12} {'requests':>9} "
              f"{'peak RSS/actor':>15} {'stored MB':>10} {'units':>6}")
        for fmt, e in formats.items():
            print(f"{fmt:<12} {e['tokens_per_s']:>12,} {e['vs_txt'] or 0:>7.2f} {e['bytes_read_ratio']:>12.2f} "
                  f"{e['requests']:>9,} {e['peak_actor_rss_mb']:>11,} MiB {e['stored_mb']:>10.1f} {e['units']:>6}")
        print(f"ceiling: {procs} processes x the actors' encode_lines batches ({cfg.shard.tokenizer_threads} "
              f"tokenizer thread(s) each, no I/O): {process_ceiling['seconds']:.2f} s, {n_ceiling:,.0f} tokens/s "
              f"(best of {len(runs['process-ceiling'])}); plain text / ceiling = {rate['tpu-ray'] / n_ceiling:.2f}")
        if process_ceiling["tokens"] != tokens:
            print(f"  note: the ceiling's processes counted {process_ceiling['tokens']:,} tokens (special-token "
                  f"strings respelled, long lines cut, as the actors do), the rates divide {tokens:,}")
        print(f"CPU-s per M tokens: ceiling {ceiling_cpu / tokens * 1e6:.3f}, tpu-ray's actors (plain text) "
              f"{actor_cpu / tokens * 1e6:.3f}: {actor_cpu / ceiling_cpu:.2f}x, the share of everything that is "
              f"not tokenization (reading, joining, cutting, writing, Ray's calls): "
              f"{1 - ceiling_cpu / actor_cpu:.0%} of the actors' CPU")
        result["formats"] = formats
        result["process_ceiling_tokens_per_s"] = round(n_ceiling)
        result["txt_vs_ceiling"] = round(rate["tpu-ray"] / n_ceiling, 2)
        result["ceiling_cpu_s_per_mtok"] = round(ceiling_cpu / tokens * 1e6, 3)
        result["txt_cpu_vs_ceiling"] = round(actor_cpu / ceiling_cpu, 2)
    print(json.dumps(result))
    if multi and not same:
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--reference-child":
        corpus_path, tok_dir, out_dir, procs, seq_len = sys.argv[2:7]
        print(json.dumps(reference_child(corpus_path, tok_dir, out_dir, int(procs), int(seq_len), 1000)))
    elif len(sys.argv) > 1 and sys.argv[1] == "--ceiling-child":
        corpus_path, start, end, tok_dir, max_line_bytes = sys.argv[2:7]
        ceiling_child(corpus_path, int(start), int(end), tok_dir, int(max_line_bytes))
    else:
        main()
