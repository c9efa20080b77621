"""`tpu-ray`: the command line. Bad input -> one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from tpu_ray.errors import EXIT_USAGE, UserError, failure_line, guarded  # noqa: F401 - EXIT_USAGE, UserError re-exported
from tpu_ray.logs import setup_logging
from tpu_ray.progress import follow, status_line
from tpu_ray.downstream.run import finetune_models

DESCRIPTION = """\
Pretrain a Hugging Face masked language model (RoBERTa by default) with TensorFlow, from raw text
to an exported model, on a TPU slice, GPUs or a CPU, orchestrated by Ray.

  tpu-ray run --config jobs/configs/quickstart.yaml --output-dir runs/quickstart
  tpu-ray report runs/quickstart        tpu-ray metrics runs/quickstart

Each command takes --help. A run is named by its directory (local path or gs://).
Every option and config field, with what it accepts: docs/options.md (the options reference)."""
OPTIONS_EPILOG = ("Every option and config field (section.key=value), with its default and what it accepts: "
                  "docs/options.md, the options reference. The guide: README.md.")


def load_config(args: argparse.Namespace):
    """The run config from --config, --output-dir, --corpus and dotted overrides, in that order."""
    from tpu_ray.config import load_run_config

    cfg = load_run_config(args.config, getattr(args, "output_dir", None), getattr(args, "corpus", None),
                          args.overrides or [])
    args.run_dir_for_interrupt = cfg.run_dir  # main() names it if Ctrl-C ends the command
    return cfg


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong and where help is) and exit code 2,
    like every other refusal: its default prints the whole usage block before the message."""

    command: str | None = None  # the subcommand parsed, set by main() before it reports stray flags

    def error(self, message: str) -> NoReturn:
        unknown = message.split("unrecognized arguments: ", 1)[1].split() if "unrecognized arguments: " in message else []
        hints = _flag_hints(self, self.command, [w.split("=")[0] for w in unknown if w.startswith("-")])
        hint = f" ({'; '.join(hints)})" if hints else ""
        where = f"{self.prog} {self.command}" if self.command else self.prog
        self.exit(EXIT_USAGE, f"{where}: error: {message}{hint}; see {where} --help\n")


def _flag_hints(parser: argparse.ArgumentParser, command: str | None, flags: list[str]) -> list[str]:
    """Per unknown flag: the subcommands that take it when this one does not (`train --corpus`:
    run, shard, submit and tokenizer do), else the closest flag this subcommand has."""
    subs = {name: sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name, sub in action.choices.items()}
    own = sorted(_option_strings(subs[command]) if command in subs else _option_strings(parser))
    hints = []
    for flag in flags:
        elsewhere = [name for name, sub in subs.items() if flag in _option_strings(sub)]
        if command in subs and elsewhere:
            takers = ", ".join(elsewhere[:-1]) + (" and " if len(elsewhere) > 1 else "") + elsewhere[-1]
            hints.append(f"`{parser.prog} {command}` has no {flag}; {takers} take{'s' if len(elsewhere) == 1 else ''} it")
        elif close := difflib.get_close_matches(flag, own or sorted(_option_strings(parser)), n=1, cutoff=0.6):
            hints.append(f"{flag}: did you mean {close[0]}?")
    return hints


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """The long flags of a parser and its subcommands: an unknown flag is reported by the top-level
    parser, which does not know the subcommand's own."""
    out = {s for s in parser._option_string_actions if s.startswith("--")}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _option_strings(sub)
    return out


def whole_number(lo: int, meaning: str = "") -> Callable[[str], int]:
    """An argparse type: an integer >= lo. `meaning` documents the edge (e.g. "0: all rows")."""
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {lo}, got {raw!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}{meaning}, got {value}")
        return value
    return parse


def nonempty(what: str) -> Callable[[str], str]:
    """An argparse type: a non-empty string. An empty path usually is an unset shell variable
    (`--output-dir "$OUT"`): refused, never replaced by a default location."""
    def parse(raw: str) -> str:
        if not raw.strip():
            raise argparse.ArgumentTypeError(f"is empty; give {what} (an unset shell variable?)")
        return raw
    return parse


def _common(p: argparse.ArgumentParser, corpus: bool = False) -> None:
    p.add_argument("--config", type=nonempty("a YAML file"), help="run config YAML (see jobs/configs/)")
    p.add_argument("--output-dir", type=nonempty("a directory path or gs:// URI"),
                   help="run directory (local path or gs://); default runs/<name>")
    if corpus:
        p.add_argument("--corpus", type=nonempty("a path, glob, gs:// URI, hf:NAME or builtin:python-docs"),
                       help="corpus: builtin:python-docs, a path or glob, gs://..., or hf:NAME")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides, e.g. train.steps=50")


_FORCE_EXPORT = "replace RUN/model even if it was exported from another config or checkpoint"


def cmd_run(args) -> int:
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.train.export import check_fill_mask_text

    if args.fill_mask:
        check_fill_mask_text(args.fill_mask)  # before the run: a typo must not cost the whole run
    # The mask token itself is checked as soon as the tokenizer is known, before any training.
    result = Pipeline(load_config(args)).run(resume=args.resume, force=args.force, fill_mask=args.fill_mask)
    _print_summary(result.run_dir)
    if args.fill_mask:
        _fill_mask(result.model_dir, args.fill_mask, 5)
    return 0


def cmd_tokenizer(args) -> int:
    from tpu_ray.pipeline import Pipeline

    cfg = load_config(args)
    info = Pipeline(cfg).tokenizer(force=args.force)
    print(json.dumps({"tokenizer_dir": cfg.tokenizer_dir, "vocab_size": info.vocab_size, "sha256": info.sha256}))
    return 0


def cmd_shard(args) -> int:
    from tpu_ray.pipeline import Pipeline

    print(Pipeline(load_config(args)).shard().line())
    return 0


def cmd_train(args) -> int:
    from tpu_ray.pipeline import Pipeline

    cfg = load_config(args)
    Pipeline(cfg).train(resume=args.resume, force=args.force)
    _print_summary(cfg.run_dir)  # the table `run` prints (RUN/summary.json holds the same figures as JSON)
    return 0


def cmd_eval(args) -> int:
    from tpu_ray import storage
    from tpu_ray.config import load_run_config
    from tpu_ray.pipeline import Pipeline

    run = _positional_run(args)
    if run is None and not args.config:
        raise UserError("name the run to evaluate: tpu-ray eval RUN (its directory, local or gs://)")
    config = args.config
    if run is not None and not storage.exists(run):
        raise UserError(f"run directory not found: {run}")
    if run is not None and os.path.isfile(run):
        raise UserError(f"{run}: is a file, not a run directory; pass the run's --output-dir")
    if config is None and storage.exists(storage.join(run, "config.yaml")):
        config = storage.join(run, "config.yaml")  # the config the run saved
    cfg = load_run_config(config, run, None, args.overrides or [])
    if not storage.exists(cfg.run_dir):
        raise UserError(f"run directory not found: {cfg.run_dir}")
    print(json.dumps(Pipeline(cfg).eval()))
    return 0


def _positional_run(args) -> str | None:
    """`eval RUN` (or the older `--output-dir RUN`). A first word like a.b=1 is an override."""
    run = getattr(args, "run", None)
    if run is not None and "=" in run and not os.path.exists(run):
        args.overrides = [run, *(args.overrides or [])]
        run = None
    if run is not None and args.output_dir and run != args.output_dir:
        raise UserError(f"two runs named: {run} and --output-dir {args.output_dir}; name one")
    return run or args.output_dir


def cmd_fill_mask(args) -> int:
    from tpu_ray import storage

    model = args.model
    if os.path.isfile(model):
        raise UserError(f"--model {model}: is a file; pass the exported model directory (RUN/model) or the run directory")
    run_model = storage.join(model, "model")  # a run named by its directory, like report and metrics
    if (not storage.exists(storage.join(model, "config.json"))
            and storage.exists(storage.join(run_model, "config.json"))):
        model = run_model
    _fill_mask(model, args.text, args.top_k)
    return 0


def _fill_mask(model_dir: str, text: str, top_k: int) -> None:
    from tpu_ray.train.export import fill_mask

    for pred in fill_mask(model_dir, text, top_k=top_k):
        print(f"{pred['score']:.4f}  {pred['token_str']!r:>16}  {pred['sequence']}")


def cmd_report(args) -> int:
    from tpu_ray.report import text_summary, write_report

    paths = write_report(args.run_dir, args.out)
    print(text_summary(args.run_dir))
    print(f"report: {paths.get('report.html', paths)}")
    return 0


def cmd_compare(args) -> int:
    from tpu_ray.comparison import comparison_text, write_comparison

    paths = write_comparison(args.runs, args.out)
    print(comparison_text(args.runs))
    print(f"comparison: {paths['compare.html']}")
    return 0


def cmd_doctor(args) -> int:
    from tpu_ray.doctor.checks import run_doctor

    return run_doctor(lambda: load_config(args), target=args.target, full=args.full)  # a bad config is a FAIL check


def cmd_submit(args) -> int:
    from tpu_ray.cluster.jobs import submit

    job = submit(load_config(args), address=args.address, working_dir=args.working_dir, resume=args.resume)
    print(job.submission_id)
    if args.wait:
        status = job.wait(follow=True)  # stream the job's log while waiting
        print(status)
        return 0 if status == "SUCCEEDED" else 1
    return 0


def cmd_status(args) -> int:
    from tpu_ray.cluster.jobs import JobHandle

    if _is_run_dir(args.submission_id):  # a run directory: its training's progress, from its metrics
        print(status_line(args.submission_id))
        return 0
    print(JobHandle(args.submission_id, args.address).status())
    return 0


def _is_run_dir(arg: str) -> bool:
    from tpu_ray import storage
    from tpu_ray.rundir import CONFIG_FILE

    try:
        return storage.exists(storage.join(arg, CONFIG_FILE))
    except (OSError, ValueError):
        return False


def cmd_logs(args) -> int:
    from tpu_ray.cluster.jobs import JobHandle

    handle = JobHandle(args.submission_id, args.address)
    if args.follow:  # stream until the job ends, like `ray job logs --follow`
        status = handle.wait(follow=True)
        return 0 if status == "SUCCEEDED" else 1
    print(handle.logs(), end="")
    return 0


def cmd_metrics(args) -> int:
    from tpu_ray.report import load_metrics
    from tpu_ray.tables import metrics_table

    if args.follow:  # the progress line, again whenever it changes, until the training ends
        return follow(args.run_dir)
    df = load_metrics(args.run_dir, kind=args.kind, missing_ok=False)
    if args.csv:
        sys.stdout.write(df.to_csv(index=False, date_format="%Y-%m-%dT%H:%M:%S.%fZ"))
    else:
        print(metrics_table(df, all_columns=args.all, tail=args.tail))
    return 0


def cmd_finetune(args) -> int:
    from tpu_ray.config import parse_overrides

    # argparse gives every positional to the models (nargs="+" is greedy): after the first (always a
    # model), the words with "=" (or empty) are the overrides, checked as such
    first, rest = args.model[0], args.model[1:]
    if not first.strip():
        raise UserError("RUN_OR_MODEL is empty; give a run directory or a model directory (an unset shell variable?)")
    models = [first] + [m for m in rest if m.strip() and "=" not in m]
    overrides = [m for m in rest if not m.strip() or "=" in m] + list(args.overrides or [])
    summaries, verdicts = finetune_models(models, args.task, seeds=args.seeds, output_dir=args.output_dir,
                                          overrides=parse_overrides(overrides))
    for summary in summaries:
        print("\n".join(([f"{summary.label}:"] if len(summaries) > 1 else []) + summary.lines()))
    if verdicts:
        print(f"did pretraining help? ({summaries[0].task}, paired by seed, each model at its own learning rate "
              f"chosen on validation)")
        print("\n".join(f"  {v.words()}" for v in verdicts))
    return 0 if all(s.best_lr is not None for s in summaries) else 1


def _print_summary(run_dir: str) -> None:
    try:
        from tpu_ray.report import text_summary

        print(text_summary(run_dir))
    except Exception as exc:  # the run succeeded; a summary glitch must not turn it into a failure
        logging.getLogger("tpu_ray").warning("could not print the summary: %s", exc)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tpu-ray", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Callable, help: str, corpus: bool = False, common: bool = True):
        p = sub.add_parser(name, help=help, description=help, epilog=OPTIONS_EPILOG)
        p.add_argument("-v", "--verbose", action="store_true",
                       help="also show library start-up messages (TensorFlow, Transformers, Ray)")
        if common:
            _common(p, corpus)
        p.set_defaults(fn=fn)
        return p

    p = add("run", cmd_run, "the whole pipeline: tokenizer, shards, training, export", corpus=True)
    p.add_argument("--resume", action="store_true", help="continue a run directory from its last checkpoint")
    p.add_argument("--fill-mask", metavar="TEXT", type=nonempty("a sentence with one [MASK]"),
                   help="after training, fill the [MASK] in TEXT. Checked before any training: an empty text or "
                        "two masks at once before anything runs, a text without the model's mask token "
                        "([MASK], or its own, e.g. <mask>) before anything runs when this run trains its "
                        "tokenizer, else right after the tokenizer stage (tokenizer.path, model.init_from, "
                        "a resumed run), before Ray and the shards")
    p.add_argument("--force", action="store_true", help=_FORCE_EXPORT)
    p = add("tokenizer", cmd_tokenizer, "train the tokenizer on the corpus", corpus=True)
    p.add_argument("--force", action="store_true", help="retrain even if the run has a tokenizer")
    add("shard", cmd_shard, "tokenize and write TFRecord shards on Ray actors (resumable)", corpus=True)
    p = add("train", cmd_train, "train on existing shards")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--force", action="store_true", help=_FORCE_EXPORT)
    p = add("eval", cmd_eval, "evaluate a run's last checkpoint on its validation shards", common=False)
    p.add_argument("run", nargs="?", metavar="RUN", type=nonempty("the run directory"),
                   help="the run directory (local path or gs://)")
    p.add_argument("--config", type=nonempty("a YAML file"), help="run config YAML (default: the one saved in RUN)")
    p.add_argument("--output-dir", type=nonempty("the run directory"), help=argparse.SUPPRESS)  # the older way to name RUN
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help="config overrides, e.g. eval.samples=2000")
    p = add("fill-mask", cmd_fill_mask, "predict the [MASK] token with an exported model", common=False)
    p.add_argument("--model", required=True, type=nonempty("a model directory (RUN/model) or a run directory"),
                   help="exported model directory (RUN/model, or just RUN)")
    p.add_argument("--top-k", type=whole_number(1), default=5,
                   help="how many predictions to print (default: 5; more than the vocabulary prints all of it)")
    p.add_argument("text", type=nonempty("a sentence with one [MASK]"), help="a sentence containing [MASK]")
    p = add("report", cmd_report, "plots, report.html and a text summary of a run", common=False)
    p.add_argument("run_dir", metavar="RUN", type=nonempty("the run directory"),
                   help="the run directory (local path or gs://)")
    p.add_argument("--out", type=nonempty("a directory"), help="where to write (default: the run directory)")
    p = add("compare", cmd_compare, "overlay runs' curves and tabulate their final figures (compare.html)",
            common=False)
    p.add_argument("runs", nargs="+", metavar="RUN", type=nonempty("a run directory"),
                   help="run directories (local paths or gs://)")
    p.add_argument("--out", type=nonempty("a directory"), default="compare",
                   help="where to write compare.html and its plots (default: ./compare)")
    p = add("doctor", cmd_doctor, "check config, data and model on CPU before paying for a TPU")
    p.add_argument("--target", default=None, type=nonempty("an accelerator name, e.g. v4-8"), help="accelerator to plan for, e.g. v4-8, v3-8, v5e-8, a100")
    p.add_argument("--full", action="store_true", help="checksum every shard, not a sample")
    p = add("submit", cmd_submit, "submit the pipeline as a Ray job", corpus=True)
    p.add_argument("--address", default=None, type=nonempty("a Ray dashboard address"),
                   help="Ray dashboard address, e.g. http://127.0.0.1:8265")
    p.add_argument("--working-dir", default=".", type=nonempty("a directory"), help="directory shipped with the job (default: .)")
    p.add_argument("--wait", action="store_true", help="wait for the job and exit 0 only if it succeeded")
    p.add_argument("--resume", action="store_true",
                   help="continue the run directory from its last checkpoint")
    for name, fn, help in (("status", cmd_status, "a job's status"), ("logs", cmd_logs, "a job's logs")):
        p = add(name, fn, help, common=False)
        p.add_argument("submission_id", type=nonempty("the id `tpu-ray submit` printed"),
                       help="the id `tpu-ray submit` printed" + (", or a run directory: its training's progress"
                                                                  if name == "status" else ""))
        p.add_argument("--address", default=None, type=nonempty("a Ray dashboard address"), help="Ray dashboard address, e.g. http://127.0.0.1:8265")
        if name == "logs":
            p.add_argument("-f", "--follow", action="store_true",
                           help="stream the log until the job ends; exit 0 only if it succeeded")
    p = add("finetune", cmd_finetune, "fine-tune a run's model on a labelled task over seeds x learning rates "
            "(Ray tasks) and record the scores", common=False)
    p.add_argument("model", metavar="RUN_OR_MODEL", nargs="+",
                   help="a run directory (its model/) or an exported model directory; two or more: each is "
                        "fine-tuned, then the first is compared with each other one (a verdict with its 95%% interval)")
    p.add_argument("--task", required=True, type=nonempty("a task"),
                   help="builtin:stdlib-packages, glue/NAME, a task YAML, or a directory with train.* and "
                        "validation.* (csv/tsv/jsonl/parquet; fields text, text_pair, label, or a token task's tokens, tags)")
    p.add_argument("--seeds", type=whole_number(1), default=None, help="seeds per learning rate (default: 5)")
    p.add_argument("--output-dir", type=nonempty("a directory"), default=None,
                   help="where to record for a model outside a run (default: the run directory)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help="e.g. finetune.learning_rates=[1e-4,3e-4] finetune.epochs=3 ray.address=local")
    p = add("metrics", cmd_metrics, "print a run's metrics (a table or CSV)", common=False)
    p.add_argument("run_dir", metavar="RUN", type=nonempty("the run directory"),
                   help="the run directory (local path or gs://)")
    p.add_argument("--kind", choices=["train", "eval", "eval_source", "eval_rerun", "event", "downstream"], default=None,
                   help="only these records (default: train, eval and eval_source)")
    p.add_argument("--tail", type=whole_number(0, " (0: all rows)"), default=20, help="the last N rows (default: 20; 0: all)")
    p.add_argument("--all", action="store_true", help="every column, not only the ones that matter")
    p.add_argument("--csv", action="store_true", help="all rows and columns as CSV (time in UTC)")
    p.add_argument("--follow", action="store_true",
                   help="print the training's progress line (step, rates, ETA) as it changes, until it ends")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.add_argument("--verbose", action="store_true", help="library logs and full tracebacks (anywhere on the line)")
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv or os.environ.get("TPU_RAY_VERBOSE", "") not in ("", "0")
    argv = [a for a in argv if a != "--verbose"]
    # Overrides may stand anywhere, also after an option (`train c.yaml a.b=1 --resume c.d=2`):
    # argparse takes one run of positionals, so later `key=value` words come back as extras.
    args, extra = parser.parse_known_args(argv)
    stray = [x for x in extra if x.startswith("-") or "=" not in x or not hasattr(args, "overrides")]
    if stray:
        parser.command = args.command  # the hint names the subcommand and the ones that take the flag
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*(args.overrides or []), *extra]
    verbose = verbose or getattr(args, "verbose", False)
    setup_logging(verbose=verbose)
    try:
        return guarded(lambda: args.fn(args))  # bad input or a refusing environment: one line, exit 2
    except KeyboardInterrupt:
        _say_interrupted(args, sys.argv[1:] if argv is None else argv)
        return 130
    except BrokenPipeError:
        return _closed_stdout()
    except Exception as exc:  # a bug: one line, exit 1 (--verbose: the traceback)
        if verbose:
            raise
        print(f"tpu-ray: error: {failure_line(exc)[0]}", file=sys.stderr)
        return 1


def _say_interrupted(args, argv: list[str]) -> None:
    """Ctrl-C: where the last checkpoint is and the command that continues from it."""
    run_dir = getattr(args, "run_dir_for_interrupt", None)
    if args.command not in ("run", "train") or run_dir is None:
        print("tpu-ray: interrupted", file=sys.stderr)
        return
    from tpu_ray.resume import interrupted_message

    print(interrupted_message(run_dir, argv), file=sys.stderr)


def _closed_stdout() -> int:
    """The reader went away (`tpu-ray metrics --csv | head`): stop quietly. Point stdout at
    /dev/null so the interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
