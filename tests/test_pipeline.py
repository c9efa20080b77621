"""The whole pipeline end to end through the CLI, on a real local Ray cluster, and the CLI's surface."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO
from tpu_ray.cli import EXIT_USAGE, build_parser, main

QUICKSTART = str(REPO / "jobs" / "configs" / "quickstart.yaml")
# The quickstart shrunk to a test: a tiny vocabulary, short samples, a few dozen steps. A zero output
# bias: 40 steps on the small corpus do not leave the word-frequency plateau, where the shipped
# unigram bias starts (tests/test_output_bias.py), so the falling loss below is the climb down to it.
SHRINK = ["tokenizer.vocab_size=800", "shard.seq_len=64", "shard.unit_bytes=65536", "train.steps=40",
          "train.batch_size=16", "train.warmup_steps=4", "train.log_every=5", "train.eval_every=20",
          "eval.samples=64", "train.checkpoint_every=20", "train.shuffle_buffer=512", "model.output_bias=zeros"]


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory, small_corpus, ray_local):
    """`tpu-ray run` with the quickstart config, the test corpus and the shrinking overrides."""
    run_dir = tmp_path_factory.mktemp("e2e") / "run"
    code = main(["run", "--config", QUICKSTART, "--corpus", str(small_corpus), "--output-dir", str(run_dir),
                 "--fill-mask", "The [MASK] of the river.", *SHRINK])
    assert code == 0
    return run_dir


def _records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_run_directory_is_complete(quickstart_run):
    d = quickstart_run
    for name in ("config.yaml", "run_info.json", "tokenizer/tokenizer.json", "shards/manifest.json",
                 "metrics.jsonl", "model/config.json", "model/tf_model.h5", "model/tokenizer.json",
                 "model/model.safetensors", "model/README.md", "summary.json"):
        assert (d / name).exists(), name
    saved = yaml.safe_load((d / "config.yaml").read_text())
    assert saved["train"]["steps"] == 40 and saved["corpus"]["source"].endswith("small.txt")
    versions = json.loads((d / "run_info.json").read_text())["versions"]
    assert {"tensorflow", "transformers", "tokenizers", "datasets", "ray"} <= set(versions)
    manifest = json.loads((d / "shards" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["seq_len"] == 64
    assert manifest["splits"]["train"]["samples"] > 0 and manifest["splits"]["validation"]["samples"] > 0


def test_training_loss_goes_down_and_the_step_traced_once(quickstart_run):
    train = _records(quickstart_run, "train")
    assert [r["step"] for r in train] == list(range(5, 41, 5))
    first, last = train[0]["loss"], train[-1]["loss"]
    assert last < first - 0.5, (first, last)
    assert all(r["train_traces"] == 1 for r in train)
    evals = _records(quickstart_run, "eval")
    assert [r["step"] for r in evals] == [20, 40]
    assert evals[-1]["perplexity"] == pytest.approx(2.718281828 ** evals[-1]["eval_loss"], rel=1e-6)
    summary = json.loads((quickstart_run / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["eval_loss"] == evals[-1]["eval_loss"]


@pytest.fixture(scope="module")
def staged_run(tmp_path_factory, small_corpus, ray_local, quickstart_run):
    """The same run as quickstart_run, made by `tokenizer`, `shard` and `train` one after another."""
    run_dir = tmp_path_factory.mktemp("staged") / "run"
    common = ["--config", QUICKSTART, "--output-dir", str(run_dir), f"corpus.source={small_corpus}", *SHRINK]
    for argv in (["tokenizer"], ["shard"], ["train"]):
        assert main([*argv, *common]) == 0, argv
    return run_dir


def _numbers(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_staged_commands_leave_the_summary_that_run_leaves(staged_run, quickstart_run):
    """`tokenizer`, `shard`, `train` alone write RUN/summary.json as `run` does, with the
    same keys and the same numbers (same config, seed and corpus: the same shards and steps)."""
    staged, whole = _numbers(staged_run), _numbers(quickstart_run)
    assert set(staged) == set(whole)
    assert set(staged["stage_seconds"]) == {"tokenizer", "shard", "train"} == set(whole["stage_seconds"])
    assert staged["tokenizer"]["sha256"] == whole["tokenizer"]["sha256"]
    for key in ("shards", "samples", "tokens", "units"):
        assert staged["shards"][key] == whole["shards"][key], key
    assert staged["steps"] == whole["steps"] == 40
    for key in ("final_loss", "eval_loss", "perplexity"):
        assert staged[key] == pytest.approx(whole[key], rel=1e-3), key


def test_report_and_metrics_show_a_staged_run_like_a_run(staged_run, quickstart_run, capsys):
    from tpu_ray.report import text_summary

    def rows(run_dir: Path) -> dict[str, str]:
        lines = [ln.strip("│ ").split("│") for ln in text_summary(str(run_dir)).splitlines() if "│" in ln]
        return {cells[0].strip(): cells[-1].strip() for cells in lines if len(cells) > 1}

    staged, whole = rows(staged_run), rows(quickstart_run)
    assert set(staged) == set(whole)
    assert staged["steps"] == whole["steps"]
    for run_dir in (staged_run, quickstart_run):
        assert main(["metrics", str(run_dir), "--kind", "event", "--tail", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("stage_end") >= 6  # tokenizer, shard, train in each


def test_exported_model_answers_fill_mask(quickstart_run):
    from transformers import pipeline

    unmasker = pipeline("fill-mask", model=str(quickstart_run / "model"), framework="tf", dtype=None,
                        model_kwargs={"use_safetensors": False})  # as README.md writes it for TensorFlow
    mask = unmasker.tokenizer.mask_token  # the family's own: RoBERTa's <mask> (tpu-ray's CLI also takes [MASK])
    assert mask == "<mask>"
    preds = unmasker(f"The {mask} of the river.", top_k=3)
    assert len(preds) == 3
    assert all(mask not in p["sequence"] and 0 < p["score"] <= 1 for p in preds)


def test_fill_mask_top_k_beyond_the_vocabulary_prints_all(quickstart_run, capsys):
    """A huge --top-k is meaningful (the whole vocabulary, best first), not a TopKV2 crash."""
    assert main(["fill-mask", "--model", str(quickstart_run), "The [MASK] of the river.", "--top-k", str(10**15)]) == 0
    lines = capsys.readouterr().out.splitlines()
    vocab = json.loads((quickstart_run / "model" / "config.json").read_text())["vocab_size"]
    assert len(lines) == vocab
    scores = [float(line.split()[0]) for line in lines]
    assert scores == sorted(scores, reverse=True)


def test_fill_mask_text_without_a_mask_names_both_spellings(quickstart_run, capsys):
    """A RoBERTa model's mask is <mask>, and the CLI takes [MASK] for it: the refusal names both."""
    assert main(["fill-mask", "--model", str(quickstart_run), "no mask here"]) == 2
    err = capsys.readouterr().err.strip()
    assert "contains no mask token; put [MASK] (or the model's own <mask>) where a word is missing" in err
    assert "\n" not in err


def test_tokenizer_pad_id_matches_tf_roberta_padding_index(quickstart_run):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(quickstart_run / "model"))
    assert tok.pad_token_id == 1  # TF RoBERTa's hard-coded padding_idx
    cfg = json.loads((quickstart_run / "model" / "config.json").read_text())
    assert cfg["pad_token_id"] == 1 and cfg["vocab_size"] == len(tok)


def test_every_subcommand_has_help():
    parser = build_parser()
    names = parser._subparsers._group_actions[0].choices  # argparse keeps them here
    assert {"run", "tokenizer", "shard", "train", "eval", "fill-mask", "report", "doctor", "submit"} <= set(names)
    for name in names:
        out = subprocess.run([sys.executable, "-m", "tpu_ray.cli", name, "--help"], capture_output=True,
                             text=True, cwd=REPO, timeout=60)
        assert out.returncode == 0 and "usage: tpu-ray" in out.stdout, name


@pytest.mark.parametrize("argv, needle", [
    (["train", "--config", QUICKSTART, "train.stepz=3"], "did you mean 'train.steps'"),
    (["shard", "--config", "/nonexistent.yaml"], "/nonexistent.yaml: config file not found"),
    (["train", "--config", QUICKSTART, "train.batch_size=-1"], "train.batch_size=-1"),
])
@pytest.mark.quick
def test_bad_input_is_one_line_and_exit_code_2(argv, needle, capsys):
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


@pytest.mark.quick
def test_overrides_may_follow_options():
    args, extra = build_parser().parse_known_args(["train", "a.b=1", "--resume", "c.d=2"])
    assert extra == ["c.d=2"]  # what main() folds back into the overrides
    assert main(["train", "--config", QUICKSTART, "train.steps=5", "--resume", "train.stepz=3"]) == EXIT_USAGE


@pytest.mark.quick
def test_log_lines_follow_stderr_when_it_is_replaced(monkeypatch):
    """A handler bound to the first stderr would write into a closed stream once a notebook, job
    runner or test harness swaps stderr; ours always writes to the current one."""
    import io
    import logging

    from tpu_ray.logs import setup_logging

    setup_logging()
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logging.getLogger("tpu_ray.test").info("to the first")
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("tpu_ray.test").info("to the second")
    assert "to the second" in second.getvalue() and "Logging error" not in second.getvalue()
