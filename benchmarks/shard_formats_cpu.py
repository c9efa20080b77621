"""Readers' cost per format: CPU seconds per format for the same text: process_unit (what an actor runs) over every unit, one
process, one tokenizer thread, formats interleaved, best of 3 rounds. CPU time, not wall time: the
machine is shared (load average > 10), and CPU time of one process is what the reader costs.

    python benchmarks/shard_formats_cpu.py 20   # MB of WikiText-2, in each format
"""
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._common import build_corpus, train_benchmark_tokenizer
from benchmarks.shard_throughput import write_format, corpus_lines
from tpu_ray.config import CorpusConfig, ShardConfig
from tpu_ray.prepare.corpus import plan_units
from tpu_ray.prepare.shards import process_unit
from tpu_ray.prepare.tokenizer import describe, load_tokenizer_json
from tokenizers import Tokenizer
mb = float(sys.argv[1]) if len(sys.argv) > 1 else 20
work = Path(tempfile.mkdtemp(prefix="fmtspeed-"))
corpus = build_corpus(work / "corpus.txt", mb)
tokdir = train_benchmark_tokenizer(work / "tok", 10_000, 128)
text = load_tokenizer_json(tokdir)
tok = Tokenizer.from_str(text)
info = describe(text, tokdir)
lines = corpus_lines(corpus)
sources = {f: write_format(f, corpus, lines, work / "fmt" / f) for f in ("txt", "jsonl.gz", "jsonl.zst", "parquet", "hf-disk")}
del lines
best = {}
for r in range(3):
    for fmt, (src, _stored) in sources.items():
        units = plan_units(CorpusConfig(source=src), ShardConfig(unit_bytes=1 << 20, seq_len=128), str(work / f"run-{fmt}"))
        out = work / f"out-{fmt}-{r}"
        c0, w0 = time.process_time(), time.perf_counter()
        tokens = 0
        for u in units:
            tokens += process_unit(u, tok, info, 128, str(out))["tokens"]
        c, w = time.process_time() - c0, time.perf_counter() - w0
        if fmt not in best or c < best[fmt]["cpu_s"]:
            best[fmt] = {"cpu_s": round(c, 2), "wall_s": round(w, 2), "tokens": tokens, "units": len(units)}
base = best["txt"]["tokens"] / best["txt"]["cpu_s"]
for fmt, b in best.items():
    b["tokens_per_cpu_s"] = round(b["tokens"] / b["cpu_s"])
    b["vs_txt"] = round(b["tokens_per_cpu_s"] / base, 2)
    print(f"{fmt:<10} {b['tokens_per_cpu_s']:>10,} tokens/CPU-s  vs txt {b['vs_txt']:.2f}  cpu {b['cpu_s']} s  wall {b['wall_s']} s  units {b['units']}  tokens {b['tokens']:,}")
print(json.dumps(best))
