"""Every option is checked. Two catalogues, enumerated from the code itself: every option of
every `tpu-ray` subcommand (from the argparse parser) and every field of the run config (from the
pydantic schema). Each has a row saying what it accepts; each bad value (0, -1 and a huge number for
numbers; an empty string for text and paths; a file where a directory belongs and the reverse) is
either meaningful (the row says what it means) or refused with one line, exit 2, naming the option.

A new option or config field without a row fails `test_*_catalogue_covers_*`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.test_report import make_run
from tpu_ray.cli import build_parser, main
from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError

HUGE = 10**15  # within int64, beyond every upper bound that exists


# ------------------------------------------------------------------------------------- the rows
@dataclass(frozen=True)
class Flag:
    """A switch (store_true): no value to get wrong."""


@dataclass(frozen=True)
class Count:
    """A whole number >= lo; `huge` says what a huge value means (it is accepted)."""

    lo: int
    huge: str


@dataclass(frozen=True)
class Text:
    """A non-empty string (a name, an address, a sentence)."""


@dataclass(frozen=True)
class Choice:
    """One of argparse's choices."""


@dataclass(frozen=True)
class Dir:
    """A directory (run, model, output): '' refused; an existing file refused naming it."""

    where_file: str  # the words of the refusal when a file stands where the directory belongs


@dataclass(frozen=True)
class File:
    """A file (a config): '' refused; a directory refused naming it."""


@dataclass(frozen=True)
class Source:
    """A corpus: '' refused; a directory is meaningful (its text files, as a glob would give)."""


@dataclass(frozen=True)
class Overrides:
    """`section.key=value` words: checked by the config catalogue below; '' and `key=` refused."""


IS_FILE = "is a file"
IN_THE_WAY = "a file is in the way"
CLI_ROWS: dict[tuple[str, str], object] = {
    **{(cmd, "--verbose"): Flag() for cmd in ("run", "tokenizer", "shard", "train", "eval", "fill-mask", "report",
                                               "doctor", "submit", "status", "logs", "metrics", "compare",
                                               "finetune")},
    **{(cmd, "--config"): File() for cmd in ("run", "tokenizer", "shard", "train", "eval", "doctor", "submit")},
    **{(cmd, "--corpus"): Source() for cmd in ("run", "tokenizer", "shard", "submit")},
    **{(cmd, "overrides"): Overrides() for cmd in ("run", "tokenizer", "shard", "train", "eval", "doctor", "submit")},
    **{(cmd, "--output-dir"): Dir(IN_THE_WAY) for cmd in ("run", "tokenizer", "shard", "train", "doctor")},
    ("submit", "--output-dir"): Dir(IN_THE_WAY),
    ("eval", "--output-dir"): Dir(IS_FILE),
    **{(cmd, "--resume"): Flag() for cmd in ("run", "train", "submit")},
    ("run", "--fill-mask"): Text(),
    **{(cmd, "--force"): Flag() for cmd in ("tokenizer", "run", "train")},
    ("eval", "run"): Dir(IS_FILE),
    ("fill-mask", "--model"): Dir(IS_FILE),
    ("fill-mask", "--top-k"): Count(1, "the whole vocabulary, best first "
                                      "(test_pipeline.py::test_fill_mask_top_k_beyond_the_vocabulary_prints_all)"),
    ("fill-mask", "text"): Text(),
    ("report", "run_dir"): Dir(IS_FILE),
    ("report", "--out"): Dir("--out is an existing file"),
    ("doctor", "--target"): Text(),
    ("doctor", "--full"): Flag(),
    ("submit", "--address"): Text(),
    ("submit", "--working-dir"): Dir("has no jobs/pretrain.py"),
    ("submit", "--wait"): Flag(),
    **{(cmd, "submission_id"): Text() for cmd in ("status", "logs")},
    **{(cmd, "--address"): Text() for cmd in ("status", "logs")},
    ("logs", "--follow"): Flag(),
    ("metrics", "run_dir"): Dir(IS_FILE),
    ("metrics", "--kind"): Choice(),
    ("metrics", "--tail"): Count(0, "every row, as 0 does"),
    ("metrics", "--all"): Flag(),
    ("metrics", "--csv"): Flag(),
    ("metrics", "--follow"): Flag(),
    ("compare", "runs"): Dir(IS_FILE),
    ("compare", "--out"): Dir("--out is an existing file"),
    ("finetune", "model"): Dir(IS_FILE),
    ("finetune", "--task"): Text(),
    ("finetune", "--seeds"): Count(1, "that many seeds per learning rate (tests/test_downstream_finetune.py)"),
    ("finetune", "--output-dir"): Dir(IN_THE_WAY),
    ("finetune", "overrides"): Overrides(),
}


def _cli_options() -> dict[tuple[str, str], argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {(name, a.option_strings[-1] if a.option_strings else a.dest): a
            for name, p in sub.choices.items() for a in p._actions if not isinstance(a, argparse._HelpAction)}


@pytest.mark.quick
def test_cli_catalogue_covers_every_option_of_every_command():
    options = set(_cli_options())
    assert sorted(options - set(CLI_ROWS)) == [], "options without a row in CLI_ROWS"
    assert sorted(set(CLI_ROWS) - options) == [], "rows for options that no longer exist"


# ------------------------------------------------------------------------------ running a probe
# A valid command line per subcommand; "<dest>" stands for a positional. A probe replaces one value.
BASE: dict[str, list[str]] = {
    "run": ["--corpus", "<corpus>", "--output-dir", "<tmp>/out"],
    "tokenizer": ["--corpus", "<corpus>", "--output-dir", "<tmp>/out"],
    "shard": ["--corpus", "<corpus>", "--output-dir", "<tmp>/out"],
    "train": ["--output-dir", "<tmp>/out"],
    "eval": ["<run>"],
    "fill-mask": ["--model", "<tmp>/model", "<text>"],
    "report": ["<run_dir>"],
    "doctor": ["--output-dir", "<tmp>/out"],
    "submit": ["--output-dir", "<tmp>/out", "--address", "http://127.0.0.1:1", "--working-dir", str(REPO)],
    "status": ["<submission_id>", "--address", "http://127.0.0.1:1"],
    "logs": ["<submission_id>", "--address", "http://127.0.0.1:1"],
    "metrics": ["<run_dir>"],
    "compare": ["<runs>", "--out", "<tmp>/cmp"],
    "finetune": ["--task", "builtin:stdlib-packages", "--output-dir", "<tmp>/ft", "<model>"],
}


def _argv(cmd: str, option: str, value: str, ctx: dict[str, str]) -> list[str]:
    words = list(BASE[cmd])
    if cmd == "eval" and option == "--output-dir":  # the older way to name RUN: instead of it, not beside
        words = ["--output-dir", "<run>"]
    if f"<{option}>" in words:
        words[words.index(f"<{option}>")] = value
    elif option in words:
        words[words.index(option) + 1] = value
    else:
        words += [value] if option == "overrides" else [option, value]
    defaults = {"<corpus>": ctx["corpus"], "<run>": ctx["run"], "<model>": ctx["run"], "<run_dir>": ctx["run"], "<runs>": ctx["run"], "<text>": "a [MASK] b",
                "<submission_id>": "raysubmit_1"}
    return [cmd, *(defaults.get(w, w.replace("<tmp>", ctx["tmp"])) for w in words)]


def _refused(argv: list[str], capsys) -> str:
    """Run the command; it must exit 2 with one line on stderr and nothing on stdout. The line.

    `doctor` is the one exception, by design (docs: "a bad config is a FAIL check"): what argparse
    accepts, doctor reports as its first check, FAIL with the same line, exit 1."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    out, err = capsys.readouterr()
    if argv[0] == "doctor" and code == 1:
        fails = [ln for ln in out.splitlines() if ln.startswith("FAIL")]
        assert len(fails) == 1 and "nothing else checked" in out, (argv, out)
        return fails[0]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (argv, code, err)
    assert len(lines) == 1 and out == "", (argv, err, out)
    return lines[0]


def _probes(row) -> list[tuple[str, str, str | None]]:
    """(label, value, words the refusal must contain; None where the value is meaningful)."""
    if isinstance(row, Count):
        return [(label, str(v), None if v >= row.lo else f"must be >= {row.lo}")
                for label, v in (("0", 0), ("-1", -1), ("huge", HUGE))]
    if isinstance(row, (Text, Dir, File, Source)):
        probes = [("empty", "", "is empty")]
        if isinstance(row, Dir):
            probes.append(("a file", "<file>", row.where_file))
        if isinstance(row, File):
            probes.append(("a directory", "<dir>", "is a directory"))
        return probes
    if isinstance(row, Choice):
        return [("unknown", "nonsense", "invalid choice")]
    if isinstance(row, Overrides):
        return [("empty word", "", "expected section.key=value"), ("empty value", "train.steps=", "empty value")]
    return []


CLI_PROBES = [(cmd, option, *probe) for (cmd, option), row in CLI_ROWS.items() for probe in _probes(row)]


@pytest.fixture(scope="module")
def probe_ctx(tmp_path_factory, small_corpus) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("probe")
    (tmp / "a-file").write_text("x")
    (tmp / "a-dir").mkdir()
    make_run(tmp / "run")
    return {"tmp": str(tmp), "corpus": str(small_corpus), "run": str(tmp / "run"), "file": str(tmp / "a-file"),
            "dir": str(tmp / "a-dir")}


@pytest.mark.parametrize("cmd, option, label, value, needle", CLI_PROBES,
                         ids=[f"{c} {o} {lbl}" for c, o, lbl, _, _ in CLI_PROBES])
@pytest.mark.quick
def test_cli_bad_value_is_meaningful_or_one_line_exit_2(cmd, option, label, value, needle, probe_ctx, capsys,
                                                        monkeypatch):
    monkeypatch.chdir(probe_ctx["tmp"])  # a default runs/<name> would land here, not in the repository
    value = probe_ctx["file"] if value == "<file>" else probe_ctx["dir"] if value == "<dir>" else value
    argv = _argv(cmd, option, value, probe_ctx)
    if needle is None:  # meaningful: parsed as given (what it means is in the row; its test runs it)
        args, _ = build_parser().parse_known_args(argv)
        assert getattr(args, option.lstrip("-").replace("-", "_")) == int(value)
        return
    line = _refused(argv, capsys)
    assert needle in line, (argv, line)
    named = option if option.startswith("-") else None
    if named and label in ("empty", "0", "-1", "unknown"):  # argparse-level: the option by name
        assert named in line, (argv, line)
    if label in ("a file", "a directory"):  # found at run time: the path by name
        assert value in line, (argv, line)
    assert not (Path(probe_ctx["tmp"]) / "runs").exists(), "a refused command made a default run directory"


@pytest.mark.quick
def test_metrics_tail_zero_and_huge_both_show_every_row(probe_ctx, capsys):
    assert main(["metrics", probe_ctx["run"], "--tail", "0"]) == 0
    every = capsys.readouterr().out
    assert main(["metrics", probe_ctx["run"], "--tail", str(HUGE)]) == 0
    assert capsys.readouterr().out == every


# ------------------------------------------------------------------------------- the config schema
@dataclass(frozen=True)
class Num:
    """Accepted: lo (<) <= v <= (<) hi. `meaning` says what an accepted edge (0, huge) does."""

    lo: float | None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    meaning: str = ""

    def accepts(self, v: float) -> bool:
        above = self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)
        below = self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)
        return above and below


@dataclass(frozen=True)
class Str:
    """Text; `path` is 'dir' (a directory or gs:// prefix), 'source' (file, glob or directory) or ''."""

    path: str = ""


@dataclass(frozen=True)
class Enum:
    """A Literal: anything else is refused with the accepted values."""


@dataclass(frozen=True)
class Bool:
    """true/false; a word that is neither is refused."""


@dataclass(frozen=True)
class Structured:
    """A mapping or list of sections: its bad values are tested by its own tests, not probed here."""


def gt0(meaning: str = "") -> Num:
    return Num(0, None, lo_open=True, meaning=meaning)


def fraction(lo_open=False, hi_open=True) -> Num:
    return Num(0, 1, lo_open=lo_open, hi_open=hi_open)


CONFIG_ROWS: dict[str, object] = {
    "name": Str(),
    "seed": Num(0, 2**32, hi_open=True, meaning="0 is a seed like any other"),
    "output_dir": Str("dir"),
    "corpus.source": Str("source"),
    "corpus.hf_config": Str(),
    "corpus.hf_split": Str(),
    "corpus.text_field": Str(),
    "corpus.text_lists": Enum(),
    "corpus.validation_source": Str("source"),
    "corpus.validation_fraction": fraction(),  # 0: no validation split from the units
    "corpus.encoding_errors": Enum(),
    "corpus.max_bytes": gt0("huge: no limit, the whole corpus"),
    "corpus.max_rows": gt0("huge: no limit, every record"),
    "corpus.max_line_bytes": Num(1024, meaning="huge: lines are never split"),
    "corpus.bad_records": Enum(),
    "corpus.max_bad_fraction": fraction(hi_open=False),  # 0: none may be bad; 1: any number
    "corpus.sources": Structured(),  # tests/test_mixture.py refuses its bad values one by one
    "corpus.weight_temperature": Num(0, 10, lo_open=True),
    "corpus.weight_schedule": Structured(),
    "eval.samples": Num(1, 10_000_000, meaning="huge is refused: beyond any validation split worth a pass"),
    "eval.mask_prob": fraction(lo_open=True),
    "eval.downstream": Structured(),  # tests/test_downstream_during.py probes its bad values
    "tokenizer.kind": Enum(),
    "tokenizer.vocab_size": Num(64, 1_000_000),
    "tokenizer.path": Str("dir"),
    "tokenizer.train_bytes": gt0("huge: the tokenizer trains on the whole corpus"),
    "tokenizer.lowercase": Bool(),
    "tokenizer.extend_tokens": Num(1, 1_000_000),
    "tokenizer.add_tokens_file": Str(),
    # At most the model's positions less its offset (RoBERTa's default: 514 - 2).
    "shard.seq_len": Num(8, 512),
    "shard.unit_bytes": Num(1024, meaning="huge: one work unit per file"),
    "shard.unit_rows": Num(1, meaning="huge: one work unit per table"),
    "shard.num_actors": Num(1, 4096),
    "shard.tokenizer_threads": Num(1, 256),
    "shard.dir": Str("dir"),
    "shard.max_unit_retries": Num(0, meaning="0: a unit whose actor dies fails the run; huge: retried forever"),
    "model.model_type": Enum(),
    "model.init_from": Str("dir"),
    "model.init_sha256": Str(),
    "model.preset": Enum(),
    "model.hidden_size": Num(0, 40_960, lo_open=True),
    "model.num_hidden_layers": Num(0, 576, lo_open=True),
    "model.num_attention_heads": Num(0, 512, lo_open=True),
    "model.intermediate_size": Num(0, 163_840, lo_open=True),
    "model.max_position_embeddings": Num(0, 1 << 20, lo_open=True),
    "model.layer_norm_eps": fraction(lo_open=True),
    "model.dropout": fraction(),  # 0: no dropout
    "model.output_bias": Enum(),
    "model.initializer_range": Num(0, 1, lo_open=True),
    "train.steps": gt0("huge: trains until stopped; --resume continues"),
    "train.batch_size": Num(0, 1 << 20, lo_open=True),
    "train.learning_rate": gt0("huge: diverges, and training stops at the first non-finite loss naming the "
                               "step (test_cli_under_faults.py::test_diverged_loss_stops_naming_the_step_...)"),
    "train.warmup_steps": Num(0, meaning="0: no warm-up; more than train.steps: the rate rises all run"),
    "train.warmup_ratio": fraction(hi_open=False),
    "train.schedule": Enum(),
    "train.decay_steps": gt0("huge: ignored by the default linear schedule (doctor warns); train.schedule=wsd "
                             "refuses a decay longer than the run"),
    "train.decay_fraction": fraction(lo_open=True, hi_open=False),  # 1: wsd decays from the warm-up's end
    "train.decay_shape": Enum(),
    "train.min_lr_ratio": fraction(hi_open=False),  # 0: decay to zero; 1: no decay
    "train.branch_from": Str("dir"),
    "train.mask_schedule": Enum(),
    "train.mask_prob_end": fraction(lo_open=True),
    "train.phases": Structured(),  # tests/test_phases.py probes its bad values
    "train.weight_decay": fraction(hi_open=False),  # 0: no weight decay
    "train.mask_prob": fraction(lo_open=True),
    "train.whole_word_mask": Bool(),
    "train.mask_count": Enum(),
    "train.mask_token_fraction": fraction(hi_open=False),  # 0: no mask tokens (random/unchanged only)
    "train.random_token_fraction": fraction(hi_open=False),  # 1 only with mask_token_fraction 0
    "train.log_every": gt0("huge: logs at the last step only"),
    "train.eval_every": gt0("huge: evaluates at the last step only"),
    "train.checkpoint_every": gt0("huge: checkpoints at the last step only"),
    "train.keep_checkpoints": gt0("huge: keeps every checkpoint"),
    "train.checkpoint_every_minutes": gt0("huge: by steps only"),
    "train.steps_per_execution": gt0("huge: as many steps as fit before the next log/eval/checkpoint"),
    "train.shuffle_buffer": Num(0, 10_000_000, lo_open=True),
    "train.strategy": Enum(),
    "train.tpu_name": Str(),
    "train.mixed_precision": Enum(),
    "train.jit_compile": Bool(),
    "train.peak_flops": gt0("huge: MFU is reported against that peak"),
    "train.cpu_replicas": Num(1, 64),
    "train.placement": Enum(),
    "train.tpu_topology": Str(),
    "train.tpu_wait_timeout_s": Num(0, 30 * 86400, lo_open=True),
    "train.num_gpus": Num(1, 1024),
    "train.workers": Num(1, 4096),
    "train.workers_network_closed": Bool(),
    "train.on_nan": Enum(),
    "train.extend_schedule": Bool(),
    "train.accept_new_data_order": Bool(),
    "train.max_failures": Num(0, meaning="0: a lost slice fails the run; huge: recovers forever"),
    "train.resume_wait_minutes": Num(0, 30 * 1440, lo_open=True),
    "ray.address": Str(),
    "ray.num_cpus": Num(0, 4096, lo_open=True),
    "ray.shared_filesystem": Bool(),
    "tracking.mlflow.uri": Str(),
    "tracking.mlflow.experiment": Str(),
    "tracking.mlflow.run_name": Str(),
    "tracking.mlflow.tags": Structured(),
    "tracking.wandb.project": Str(),
    "tracking.wandb.entity": Str(),
    "tracking.wandb.run_name": Str(),
    "tracking.wandb.tags": Structured(),
    "tracking.wandb.mode": Enum(),
}


def _config_fields(model=RunConfig, prefix: str = "") -> dict[str, type]:
    from pydantic import BaseModel

    out: dict[str, type] = {}
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _config_fields(ann, f"{prefix}{name}.")
        else:
            out[prefix + name] = ann
    return out


@pytest.mark.quick
def test_config_catalogue_covers_every_field():
    fields = set(_config_fields())
    assert sorted(fields - set(CONFIG_ROWS)) == [], "config fields without a row in CONFIG_ROWS"
    assert sorted(set(CONFIG_ROWS) - fields) == [], "rows for fields that no longer exist"


def _config_probes() -> list[tuple[str, str, object, bool]]:
    """(field, label, value, accepted)."""
    fields = _config_fields()
    out = []
    for key, row in CONFIG_ROWS.items():
        if isinstance(row, Num):
            is_float = float in getattr(fields[key], "__args__", (fields[key],))
            for label, v in (("0", 0), ("-1", -1), ("huge", HUGE)):
                value = float(v) if is_float else v
                out.append((key, label, value, row.accepts(value)))
        elif isinstance(row, Str):
            out.append((key, "empty", "", False))
            out.append((key, "blank", "  ", False))
        elif isinstance(row, Enum):
            out.append((key, "unknown", "nonsense", False))
        elif isinstance(row, Bool):
            out.append((key, "not a bool", "maybe", False))
    return out


CONFIG_PROBES = _config_probes()


@pytest.mark.parametrize("key, label, value, accepted", CONFIG_PROBES,
                         ids=[f"{k} {lbl}" for k, lbl, _, _ in CONFIG_PROBES])
@pytest.mark.quick
def test_config_value_is_accepted_or_refused_naming_the_field(key, label, value, accepted):
    if accepted:
        assert RunConfig().override({key: value}) is not None
        return
    with pytest.raises(UserError) as err:
        RunConfig().override({key: value})
    message = str(err.value)
    assert f"{key}=" in message and "\n" not in message, message


@pytest.mark.parametrize("word", ["output_dir=", "corpus.source=", "tokenizer.path= "])
@pytest.mark.quick
def test_an_empty_override_never_means_the_default(word, capsys, tmp_path, monkeypatch):
    """`output_dir=$OUT` with OUT unset: refused, not a run under runs/<name>."""
    monkeypatch.chdir(tmp_path)
    line = _refused(["tokenizer", word], capsys)
    assert "empty value" in line and word.split("=")[0] in line
    assert not (tmp_path / "runs").exists()


PATH_PROBES = [("output_dir", "<file>", IN_THE_WAY), ("tokenizer.path", "<file>", "tokenizer.path=<file>"),
               ("shard.dir", "<file>", "shard.dir=<file>")]


@pytest.mark.parametrize("key, value, needle", PATH_PROBES, ids=[p[0] for p in PATH_PROBES])
@pytest.mark.quick
def test_a_file_where_a_config_directory_belongs_is_one_line(key, value, needle, probe_ctx, capsys, monkeypatch):
    monkeypatch.chdir(probe_ctx["tmp"])
    out = [] if key == "output_dir" else ["--output-dir", f"{probe_ctx['tmp']}/cfg-out"]
    line = _refused(["tokenizer", "--corpus", probe_ctx["corpus"], *out, f"{key}={probe_ctx['file']}"], capsys)
    assert needle.replace("<file>", probe_ctx["file"]) in line, line


@pytest.mark.quick
def test_docs_options_table_is_current():
    """docs/options.md documents every option and field with what it accepts; regenerate it with
    `python docs/make_options.py` when the parser or the schema changes."""
    from tpu_ray.cli import build_parser
    from tpu_ray.options_doc import render

    assert (REPO / "docs" / "options.md").read_text() == render(build_parser())
