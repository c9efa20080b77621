"""Runs compared side by side (issue 37.2): `tpu_ray.compare` and `tpu-ray compare RUN...`.

Run directories are written as a training run writes them (metrics.jsonl, config.yaml, summary.json;
tests/test_report.py's make_run), then given different configs, evaluation sets and sources.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_report import PNG_MAGIC, make_run
from tpu_ray.cli import main
from tpu_ray.comparison import PAGE, PLOTS, write_comparison

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def _run(path: Path, config: str, eval_set: str, tokenizer: str = "aaaa", scale: float = 1.0) -> str:
    """A run whose evaluations name `eval_set`, with two sources' evaluations and `config`."""
    make_run(path, partial=False)
    recs = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    out = []
    for r in recs:
        if r.get("kind") == "train":
            r["loss"] *= scale
        if r.get("kind") == "eval":
            r.update(eval_loss=r["eval_loss"] * scale, eval_set=eval_set, eval_mask_prob=0.15, bits_per_byte=0.5 * scale)
            out.append(r)
            for i, name in enumerate(("domain", "general")):
                out.append({"kind": "eval_source", "step": r["step"], "time": r["time"] + 0.1, "source": name,
                            "eval_loss": r["eval_loss"] + i, "perplexity": 2.0 ** (r["eval_loss"] + i),
                            "bits_per_byte": 0.4 + i / 10, "eval_set": f"{eval_set}-{name}", "eval_mask_prob": 0.15})
            continue
        out.append(r)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    (path / "config.yaml").write_text(config)
    summary = json.loads((path / "summary.json").read_text())
    (path / "summary.json").write_text(json.dumps({**summary, "tokenizer": {"sha256": tokenizer}}))
    return str(path)


BASE = "name: demo\nmodel:\n  preset: tiny\ntrain:\n  steps: 500\n  batch_size: 32\n"


@pytest.fixture
def runs(tmp_path) -> list[str]:
    a = _run(tmp_path / "lr-1e-4", BASE, "set1")
    b = _run(tmp_path / "lr-3e-4", BASE + "  learning_rate: 0.0003\n", "set1", scale=0.9)
    c = _run(tmp_path / "bigger", BASE.replace("batch_size: 32", "batch_size: 64") + "tokenizer:\n  vocab_size: 900\n",
             "set2", tokenizer="bbbb", scale=1.1)
    return [a, b, c]


def test_compare_is_one_frame_with_run_group_and_the_differing_config_keys(runs):
    from tpu_ray import compare

    df = compare(runs)
    assert list(df.columns[:2]) == ["run", "eval_group"]
    assert df.attrs["differing"] == ["tokenizer.vocab_size", "train.batch_size", "train.learning_rate"]
    for key in df.attrs["differing"]:
        assert key in df.columns
    assert set(df["kind"]) == {"train", "eval", "eval_source"}  # the events are not figures
    assert df["run"].drop_duplicates().tolist() == runs
    per_run = df.groupby("run", sort=False).first()
    assert per_run["train.learning_rate"].tolist() == [0.0001, 0.0003, 0.0001]
    assert per_run["train.batch_size"].tolist() == [32, 32, 64]
    # The first two scored one set with one tokenizer: comparable; the third is not.
    assert per_run["eval_group"].tolist() == ["A", "A", "B"]
    assert len(df[(df["run"] == runs[0]) & (df["kind"] == "eval_source")]) == 6


def test_compare_of_identical_configs_has_no_config_columns(tmp_path):
    from tpu_ray import compare

    runs = [_run(tmp_path / "a", BASE, "s"), _run(tmp_path / "b", BASE, "s")]
    df = compare(runs)
    assert df.attrs["differing"] == [] and set(df["eval_group"]) == {"A"}


def test_the_page_overlays_the_runs_and_marks_the_runs_not_comparable(runs, tmp_path):
    paths = write_comparison(runs, str(tmp_path / "out"))
    assert sorted(paths) == sorted((*PLOTS, PAGE))
    for name in PLOTS:
        data = Path(paths[name]).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, name
    page = Path(paths[PAGE]).read_text()
    assert "NOT COMPARABLE across groups" in page and "tokenizer, evaluation set" in page
    assert "bits/byte" in page and "perplexity" in page
    for key in ("train.learning_rate", "train.batch_size", "tokenizer.vocab_size"):
        assert key in page
    assert "domain: ppl / bits/byte" in page


def test_the_plots_hold_one_line_per_run(runs, tmp_path):
    from tpu_ray.comparison import compare, plot_compare

    df = compare(runs)
    figs = {}
    import matplotlib.figure

    real = matplotlib.figure.Figure.savefig

    def keep(self, path, *a, **k):
        figs[Path(path).name] = self
        return real(self, path, *a, **k)

    matplotlib.figure.Figure.savefig = keep
    try:
        plot_compare(df, runs, {name: str(tmp_path / name) for name in PLOTS})
    finally:
        matplotlib.figure.Figure.savefig = real
    labels = [line.get_label() for line in figs["compare_loss.png"].axes[0].get_lines()]
    assert labels == ["lr-1e-4 train", "lr-1e-4 eval [eval A]", "lr-3e-4 train", "lr-3e-4 eval [eval A]",
                      "bigger train", "bigger eval [eval B]"]
    assert len(figs["compare_eval_sources.png"].axes[0].get_lines()) == 6  # 3 runs x 2 sources
    assert len(figs["compare_learning_rate.png"].axes[0].get_lines()) == 3
    assert len(figs["compare_throughput.png"].axes[0].get_lines()) == 3


def test_the_cli_writes_the_page_and_prints_the_table(runs, tmp_path, capsys):
    assert main(["compare", *runs, "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "cmp" / PAGE).exists()
    assert "eval_group" in out and "bits/byte" in out and "NOT COMPARABLE" in out
    assert "train.learning_rate: lr-1e-4=0.0001, lr-3e-4=0.0003, bigger=0.0001" in out


def test_the_cli_refuses_a_missing_run_in_one_line(runs, tmp_path, capsys):
    assert main(["compare", runs[0], str(tmp_path / "nope"), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"run directory not found: {tmp_path / 'nope'}" in err
    assert not (tmp_path / "cmp").exists()


def test_a_run_without_a_saved_config_differs_in_nothing(tmp_path):
    from tpu_ray import compare

    runs = [_run(tmp_path / "a", BASE, "s"), _run(tmp_path / "b", BASE + "  learning_rate: 0.0003\n", "s"),
            _run(tmp_path / "c", BASE, "s")]
    (tmp_path / "c" / "config.yaml").unlink()
    df = compare(runs)
    assert df.attrs["differing"] == ["train.learning_rate"]
    assert df.groupby("run", sort=False)["train.learning_rate"].first().tolist()[:2] == [0.0001, 0.0003]


def test_the_page_goes_to_gs(runs, gcs_emulator):
    from tpu_ray import storage

    bucket = gcs_emulator.make_bucket()
    paths = write_comparison(runs, f"{bucket}/cmp")
    assert paths[PAGE] == f"{bucket}/cmp/{PAGE}"
    assert "tpu-ray run comparison" in storage.read_text(paths[PAGE])
    assert storage.read_bytes(f"{bucket}/cmp/{PLOTS[0]}")[:8] == PNG_MAGIC
