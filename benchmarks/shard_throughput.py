"""Sharding throughput: tpu-ray's `make_shards` against the reference workflow and the tokenizer alone.

One run measures, on the same corpus (WikiText-2 repeated to `--mb` MB) and the same Unigram
tokenizer (vocab 10k, trained with tpu_ray.prepare.tokenizer):

1. ceiling: `tokenizers`' own `encode_batch` over the corpus lines already in memory, all cores,
   no I/O, no chunking, no writing: what tokenization alone costs;
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
the bytes stored, storage requests (tpu_ray.storage calls of the driver and the actors). And `txt_vs_ceiling`: plain text against N processes of `encode_batch_fast`
(one per CPU, one thread each, no I/O), the real ceiling of N single-threaded actors.
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


def measure_tpu_ray(cfg, actors: int | None, cpus: int, nodes: int) -> dict:
    """make_shards on a fresh local cluster of `nodes` nodes sharing `cpus` CPUs."""
    import ray

    from tpu_ray.prepare.shards import make_shards

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
    try:
        summary = make_shards(cfg, actors=actors)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    return {"seconds": summary.seconds, "samples": summary.samples, "shards": summary.shards,
            "units": summary.units, "actors": summary.actors, "tokens_with_sep": summary.tokens,
            "dropped": summary.dropped_tokens, "peak_actor_rss_bytes": summary.peak_actor_rss_bytes,
            "ray_start_s": start_up, "digest": digest_dir(Path(cfg.shards_dir)), "read_bytes": summary.read_bytes,
            "requests": summary.requests}


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


_CHILD_LINES: list[str] = []  # set before the pool forks: children read it, nothing is pickled


def _ceiling_child(args: tuple[str, int, int]) -> tuple[float, int]:
    os.environ["RAYON_NUM_THREADS"] = "1"
    from tokenizers import Tokenizer

    tokenizer_dir, index, procs = args
    lines = _CHILD_LINES[index::procs]
    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    seconds, n = 0.0, 0
    for i in range(0, len(lines), _BATCH_LINES):
        part = lines[i:i + _BATCH_LINES]
        t0 = time.perf_counter()
        n += sum(len(e.ids) for e in tok.encode_batch_fast(part, add_special_tokens=False))
        seconds += time.perf_counter() - t0
    return seconds, n


def measure_process_ceiling(tokenizer_dir: str, lines: list[str], procs: int) -> dict:
    """N processes (fork), one thread each, each `encode_batch_fast` on 1/N of the lines in memory:
    the seconds of the slowest (they run at once). What N one-threaded actors could reach."""
    import multiprocessing as mp

    global _CHILD_LINES
    _CHILD_LINES = lines
    try:
        with mp.get_context("fork").Pool(procs) as pool:
            results = pool.map(_ceiling_child, [(tokenizer_dir, i, procs) for i in range(procs)])
    finally:
        _CHILD_LINES = []
    return {"seconds": max(r[0] for r in results), "tokens": sum(r[1] for r in results)}


def measure_formats(args: argparse.Namespace, work: Path, corpus: Path, lines: list[str], tokenizer_dir: str,
                    tokens: int, txt: dict | None) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for fmt in args.format.split(","):
        source, stored = write_format(fmt, corpus, lines, work / "formats" / fmt)
        cfg = shard_config(work, Path(source), tokenizer_dir, f"fmt-{fmt}", args.seq_len, args.unit_mb)
        cfg = cfg.override({"corpus.source": source})
        r = txt if (fmt == "txt" and txt) else measure_tpu_ray(cfg, args.actors, args.cpus, 1)
        out[fmt] = {"tokens_per_s": round(tokens / r["seconds"]), "seconds": round(r["seconds"], 2),
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

    runs: dict[str, list[dict]] = {"ceiling": [], "reference": [], "tpu-ray": []}
    for _ in range(args.repeat):  # interleaved, so a burst of load on the machine hits all methods alike
        # The ceiling twice per round: its best is the strictest yardstick on a noisy machine.
        runs["ceiling"] += [measure_ceiling(tokenizer_dir, lines) for _ in range(args.ceiling_runs)]
        if not args.skip_reference:
            runs["reference"].append(measure_reference(corpus, tokenizer_dir, work, args.cpus, args.seq_len))
        runs["tpu-ray"].append(measure_tpu_ray(cfg, args.actors, args.cpus, 1))
    ceiling, ours = best(runs["ceiling"]), best(runs["tpu-ray"])
    formats = process_ceiling = None
    if args.format:
        process_ceiling = measure_process_ceiling(tokenizer_dir, lines, args.cpus)
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
    }
    if multi:
        result["nodes_identical"] = same
    if formats:
        n_ceiling = tokens / process_ceiling["seconds"]
        print(f"\n{'format':<12} {'tokens/s':>12} {'vs txt':>7} {'read/stored':>12} {'requests':>9} "
              f"{'peak RSS/actor':>15} {'stored MB':>10} {'units':>6}")
        for fmt, e in formats.items():
            print(f"{fmt:<12} {e['tokens_per_s']:>12,} {e['vs_txt'] or 0:>7.2f} {e['bytes_read_ratio']:>12.2f} "
                  f"{e['requests']:>9,} {e['peak_actor_rss_mb']:>11,} MiB {e['stored_mb']:>10.1f} {e['units']:>6}")
        print(f"ceiling: {args.cpus} processes x encode_batch_fast (1 thread, no I/O): {n_ceiling:,.0f} tokens/s; "
              f"plain text / ceiling = {rate['tpu-ray'] / n_ceiling:.2f}")
        result["formats"] = formats
        result["process_ceiling_tokens_per_s"] = round(n_ceiling)
        result["txt_vs_ceiling"] = round(rate["tpu-ray"] / n_ceiling, 2)
    print(json.dumps(result))
    if multi and not same:
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--reference-child":
        corpus_path, tok_dir, out_dir, procs, seq_len = sys.argv[2:7]
        print(json.dumps(reference_child(corpus_path, tok_dir, out_dir, int(procs), int(seq_len), 1000)))
    else:
        main()
