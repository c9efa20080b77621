"""Every file of a real run directory, damaged every way, then the command that reads it.

The table is generated from the run directory's own file list: `RULES` maps each file (a glob
relative to the run dir) to the command that reads it and what that command must do; a file the
run writes that no rule covers fails `test_every_run_file_has_a_rule`, so a new artifact cannot be
forgotten. Damage kinds: truncated (first half kept), empty, and wrong type (a directory where the
file was). "Unreadable" is not a separate row: the suite runs as root, where chmod 000 does not stop
a read; the directory row is the file that cannot be opened as one.

Expectations: "refuse" = exit 2 and one last `tpu-ray: error:` line naming the file (or, for the
exported model, its directory); "repair" = the command rewrites the file and exits 0; "tolerate" =
exit 0 is fine (a half-written last metrics line is documented as skipped), exit 2 must still be
one line naming the file. Real components: a real tiny run (Ray, TensorFlow), real CLI in-process.
"""

from __future__ import annotations

import fnmatch
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import tiny_config
from tpu_ray.cli import main

DAMAGES = ("truncated", "empty", "directory")


@dataclass(frozen=True)
class Rule:
    pattern: str  # glob relative to the run directory
    command: str  # key of COMMANDS
    expect: dict[str, str] | str = "refuse"  # per damage kind, or one for all
    needle: str | None = None  # what the error line must name (default: the file's name)
    slow: str | None = None  # reason the rows are in the slow suite
    xfail: str | None = None  # known open failure (non-strict: passes once fixed)
    each: bool = False  # damage every matching file in turn (else the first one stands for all)

    def expectation(self, damage: str) -> str:
        return self.expect if isinstance(self.expect, str) else self.expect.get(damage, "refuse")


RULES = [
    Rule(".lock", "tokenizer", {"truncated": "tolerate", "empty": "tolerate"}),  # the holder's note; flock is the lock
    Rule("config.yaml", "tokenizer"),
    Rule("run_info.json", "tokenizer", {"truncated": "repair", "empty": "repair"}),
    Rule("metrics.jsonl", "metrics", {"truncated": "tolerate", "empty": "tolerate"}),
    Rule("summary.json", "report", {"truncated": "tolerate", "empty": "tolerate"}),
    # The corpus plan is a cache: a damaged one is planned again and rewritten; a directory in its
    # place is left (a warning says the plan is not cached) and the stage plans every time.
    Rule("plan.json", "shard", {"truncated": "repair", "empty": "repair", "directory": "tolerate"}),
    Rule("tokenizer/tokenizer.json", "tokenizer"),
    Rule("tokenizer/tokenizer_config.json", "tokenizer"),
    Rule("tokenizer/special_tokens_map.json", "tokenizer"),
    Rule("shards/.lock", "shard", {"truncated": "tolerate", "empty": "tolerate"}),  # the shard dir's own lock
    Rule("shards/manifest.json", "resume", slow="builds the model to resume"),
    Rule("shards/train/train-*.tfrecord", "resume", slow="builds the model to resume"),
    Rule("shards/validation/validation-*.tfrecord", "resume", slow="builds the model to resume"),
    # A truncated state file still names the latest checkpoint (resumed from it; TF warns that it
    # ignores the rest); an empty one is rewritten naming the newest complete checkpoint, with our
    # warning saying which; a directory in its place is refused by name.
    Rule("checkpoints/*", "resume", {"truncated": "tolerate", "empty": "repair"},
         slow="builds the model and restores a checkpoint"),
    # The model card and the PyTorch weights are for people and PyTorch loaders; TensorFlow's fill-mask
    # reads neither (a damaged model.safetensors is PyTorch's own error to report at load).
    Rule("model/README.md", "fill-mask", {"truncated": "tolerate", "empty": "tolerate", "directory": "tolerate"}),
    Rule("model/model.safetensors", "fill-mask", {"truncated": "tolerate", "empty": "tolerate",
                                                  "directory": "tolerate"}),
    Rule("model/*", "fill-mask", needle="model", each=True),
    Rule("tensorboard/*", "resume", {"truncated": "tolerate", "empty": "tolerate", "directory": "tolerate"},
         slow="written only (TensorBoard reads it); a train run appends a new events file"),
]


def _argv(command: str, run: Path, cfg_yaml: str) -> list[str]:
    common = ["--config", cfg_yaml, "train.placement=local"]
    return {
        "tokenizer": ["tokenizer", *common],
        "shard": ["shard", *common],
        "train": ["train", *common, "train.steps=1"],
        "resume": ["train", "--resume", *common, "train.steps=6", "train.extend_schedule=true"],
        "metrics": ["metrics", str(run)],
        "report": ["report", str(run), "--out", str(run.parent / "report")],
        "fill-mask": ["fill-mask", "--model", str(run / "model"), "The [MASK] of the river."],
    }[command]


@pytest.fixture(scope="session")
def real_run(tmp_path_factory, small_corpus, ray_local) -> Path:
    """A tiny real run directory (tokenizer, shards, 4 trained steps, checkpoints, export), built once."""
    from tpu_ray.pipeline import Pipeline

    run = tmp_path_factory.mktemp("realrun") / "run"
    cfg = tiny_config(run, small_corpus, **{"train.steps": 4, "train.checkpoint_every": 2, "train.eval_every": 4,
                                            "train.log_every": 2, "train.placement": "local"})
    Pipeline(cfg).run()
    return run


def run_files(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())


def rule_for(rel: str) -> Rule | None:
    return next((r for r in RULES if fnmatch.fnmatch(rel, r.pattern)), None)


@pytest.mark.slow  # over the 20 s budget on its own (docs/testing.md)
def test_every_run_file_has_a_rule(real_run):
    missing = [rel for rel in run_files(real_run) if rule_for(rel) is None]
    assert not missing, f"files of a run directory with no damage rule: {missing}; add them to RULES"
    unused = [r.pattern for r in RULES if not any(fnmatch.fnmatch(rel, r.pattern) for rel in run_files(real_run))]
    assert not unused, f"rules that match no file of a run: {unused}"


def _cases():
    for rule in RULES:
        for damage in DAMAGES:
            marks = [pytest.mark.slow] if rule.slow else []
            if rule.xfail:
                marks.append(pytest.mark.xfail(reason=rule.xfail, strict=False))
            yield pytest.param(rule, damage, id=f"{rule.pattern}-{damage}", marks=marks)


def damage(path: Path, kind: str) -> None:
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.unlink()
        path.mkdir()
        (path / "inside").write_text("x")
    else:  # pragma: no cover
        raise ValueError(kind)


@pytest.mark.parametrize("rule,kind", list(_cases()))
def test_damaged_run_file(rule, kind, real_run, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(real_run, run)
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(run, Path(real_run_corpus(real_run)), **{"train.steps": 4, "train.checkpoint_every": 2,
                                                                 "train.eval_every": 4, "train.log_every": 2,
                                                                 "train.placement": "local"})
    cfg_yaml = tmp_path / "cfg.yaml"
    cfg_yaml.write_text(cfg.to_yaml())
    matches = [f for f in run_files(run) if rule_for(f) is rule]  # a file belongs to its first rule
    for rel in matches if rule.each else matches[:1]:
        target = run / rel
        kept = tmp_path / "kept"
        shutil.copyfile(target, kept)
        damage(target, kind)
        capsys.readouterr()
        check(rule, kind, rel, target, main_err(main(_argv(rule.command, run, str(cfg_yaml))), capsys))
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        shutil.copyfile(kept, target)


def main_err(code: int, capsys) -> tuple[int, str]:
    return code, capsys.readouterr().err


def check(rule: Rule, kind: str, rel: str, target: Path, result: tuple[int, str]) -> None:
    code, err = result
    lines = [line for line in err.splitlines() if line.strip()]
    expect = rule.expectation(kind)
    if expect == "repair":
        assert code == 0, err
        assert target.is_file() and target.stat().st_size > 0, f"{rel} not rewritten"
        return
    if expect == "tolerate" and code == 0:
        return
    assert code == 2, f"{rel} {kind}: exit {code}\n{err}"
    errors = [line for line in lines if line.startswith("tpu-ray: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    needle = rule.needle or Path(rel).name
    assert needle in lines[-1], f"{rel} {kind}: the error does not name {needle!r}: {lines[-1]}"
    assert "internal error" not in lines[-1], lines[-1]


def real_run_corpus(run: Path) -> str:
    import yaml

    return yaml.safe_load((run / "config.yaml").read_text())["corpus"]["source"]
