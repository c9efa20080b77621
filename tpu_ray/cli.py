"""`tpu-ray`: the command line. Bad input -> one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable

from tpu_ray.errors import EXIT_USAGE, UserError, describe_failure, first_line
from tpu_ray.logs import setup_logging


def load_config(args: argparse.Namespace):
    """The run config from --config, --output-dir, --corpus and dotted overrides, in that order."""
    from tpu_ray.config import load_run_config

    return load_run_config(args.config, getattr(args, "output_dir", None), getattr(args, "corpus", None),
                           args.overrides or [])


def _common(p: argparse.ArgumentParser, corpus: bool = False) -> None:
    p.add_argument("--config", help="run config YAML (see jobs/configs/)")
    p.add_argument("--output-dir", help="run directory (local path or gs://); default runs/<name>")
    if corpus:
        p.add_argument("--corpus", help="corpus: builtin:python-docs, a path or glob, gs://..., or hf:NAME")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides, e.g. train.steps=50")


def cmd_run(args) -> int:
    from tpu_ray.pipeline import Pipeline

    result = Pipeline(load_config(args)).run(resume=args.resume)
    _print_summary(result.run_dir)
    if args.fill_mask:
        _fill_mask(result.model_dir, args.fill_mask, 5)
    return 0


def cmd_tokenizer(args) -> int:
    from tpu_ray.pipeline import prepare_run_dir, run_tokenizer
    from tpu_ray.prepare.verify import preflight_corpus

    cfg = load_config(args)
    preflight_corpus(cfg)  # bad corpus input fails before the run directory is written
    prepare_run_dir(cfg, resume=True)
    info = run_tokenizer(cfg, force=args.force)
    print(json.dumps({"tokenizer_dir": cfg.tokenizer_dir, "vocab_size": info.vocab_size, "sha256": info.sha256}))
    return 0


def cmd_shard(args) -> int:
    from tpu_ray.pipeline import ensure_ray, prepare_run_dir
    from tpu_ray.prepare.shards import make_shards
    from tpu_ray.prepare.verify import preflight_corpus

    cfg = load_config(args)
    preflight_corpus(cfg)  # bad corpus input fails before the run directory is written
    prepare_run_dir(cfg, resume=True)
    ensure_ray(cfg)
    summary = make_shards(cfg)
    print(summary.line())
    return 0


def cmd_train(args) -> int:
    from tpu_ray.pipeline import ensure_ray, prepare_run_dir
    from tpu_ray.cluster.placement import run_training

    cfg = load_config(args)
    prepare_run_dir(cfg, resume=args.resume)
    if cfg.train.placement != "local" or cfg.train.workers > 1:
        ensure_ray(cfg)
    summary = run_training(cfg, resume=args.resume)
    print(json.dumps({k: summary.get(k) for k in ("steps", "final_loss", "eval_loss", "perplexity", "model_dir")}))
    return 0


def cmd_eval(args) -> int:
    from tpu_ray.train.evaluate import evaluate_run

    cfg = load_config(args)
    print(json.dumps(evaluate_run(cfg)))
    return 0


def cmd_fill_mask(args) -> int:
    _fill_mask(args.model, args.text, args.top_k)
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


def cmd_doctor(args) -> int:
    from tpu_ray.doctor.checks import run_doctor

    return run_doctor(lambda: load_config(args), target=args.target, full=args.full)  # a bad config is a FAIL check


def cmd_submit(args) -> int:
    from tpu_ray.cluster.jobs import submit

    job = submit(load_config(args), address=args.address, working_dir=args.working_dir)
    print(job.submission_id)
    if args.wait:
        status = job.wait(follow=True)  # stream the job's log while waiting
        print(status)
        return 0 if status == "SUCCEEDED" else 1
    return 0


def cmd_status(args) -> int:
    from tpu_ray.cluster.jobs import JobHandle

    print(JobHandle(args.submission_id, args.address).status())
    return 0


def cmd_logs(args) -> int:
    from tpu_ray.cluster.jobs import JobHandle

    print(JobHandle(args.submission_id, args.address).logs(), end="")
    return 0


def cmd_metrics(args) -> int:
    from tpu_ray.report import load_metrics

    df = load_metrics(args.run_dir, kind=args.kind)
    print(df.to_csv(index=False) if args.csv else df.tail(args.tail).to_string(index=False))
    return 0


def _print_summary(run_dir: str) -> None:
    try:
        from tpu_ray.report import text_summary

        print(text_summary(run_dir))
    except Exception as exc:  # the run succeeded; a summary glitch must not turn it into a failure
        logging.getLogger("tpu_ray").warning("could not print the summary: %s", exc)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpu-ray", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, fn: Callable, help: str, corpus: bool = False, common: bool = True):
        p = sub.add_parser(name, help=help, description=help)
        if common:
            _common(p, corpus)
        p.set_defaults(fn=fn)
        return p

    p = add("run", cmd_run, "the whole pipeline: tokenizer, shards, training, export", corpus=True)
    p.add_argument("--resume", action="store_true", help="continue a run directory from its last checkpoint")
    p.add_argument("--fill-mask", metavar="TEXT", help="after training, fill the [MASK] in TEXT")
    p = add("tokenizer", cmd_tokenizer, "train the tokenizer on the corpus", corpus=True)
    p.add_argument("--force", action="store_true", help="retrain even if the run has a tokenizer")
    add("shard", cmd_shard, "tokenize and write TFRecord shards on Ray actors (resumable)", corpus=True)
    p = add("train", cmd_train, "train on existing shards")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    add("eval", cmd_eval, "evaluate the last checkpoint on the validation shards")
    p = add("fill-mask", cmd_fill_mask, "predict the [MASK] token with an exported model", common=False)
    p.add_argument("--model", required=True, help="exported model directory (<run_dir>/model)")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("text", help="a sentence containing [MASK]")
    p = add("report", cmd_report, "plots, report.html and a text summary of a run", common=False)
    p.add_argument("run_dir")
    p.add_argument("--out", help="where to write (default: the run directory)")
    p = add("doctor", cmd_doctor, "check config, data and model on CPU before paying for a TPU")
    p.add_argument("--target", default=None, help="accelerator to plan for, e.g. v4-8, v3-8, v5e-8, a100")
    p.add_argument("--full", action="store_true", help="checksum every shard, not a sample")
    p = add("submit", cmd_submit, "submit the pipeline as a Ray job", corpus=True)
    p.add_argument("--address", default=None, help="Ray dashboard address, e.g. http://127.0.0.1:8265")
    p.add_argument("--working-dir", default=".", help="directory shipped with the job (default: .)")
    p.add_argument("--wait", action="store_true", help="wait for the job and exit 0 only if it succeeded")
    for name, fn, help in (("status", cmd_status, "a job's status"), ("logs", cmd_logs, "a job's logs")):
        p = add(name, fn, help, common=False)
        p.add_argument("submission_id")
        p.add_argument("--address", default=None)
    p = add("metrics", cmd_metrics, "print a run's metrics (a table or CSV)", common=False)
    p.add_argument("run_dir")
    p.add_argument("--kind", choices=["train", "eval", "event"], default=None)
    p.add_argument("--tail", type=int, default=20)
    p.add_argument("--csv", action="store_true")
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
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*(args.overrides or []), *extra]
    setup_logging(verbose=verbose)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        line, code = failure_line(exc)
        if verbose and code != EXIT_USAGE:
            raise
        print(f"tpu-ray: error: {line}", file=sys.stderr)
        return code


def failure_line(exc: BaseException) -> tuple[str, int]:
    """One line and the exit code for any failure: bad input and a refusing environment (full or
    read-only disk, a file where a directory belongs, an unparsable file) exit 2; anything else is
    a bug, one line too (--verbose shows the traceback), exit 1."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:  # Ray wraps the cause (RayTaskError.cause)
        seen.add(id(cur))
        if isinstance(cur, UserError):
            return str(cur), EXIT_USAGE
        described = describe_failure(cur)
        if described:
            return described, EXIT_USAGE
        cur = getattr(cur, "cause", None) or cur.__cause__
    return (f"{type(exc).__name__}: {first_line(exc)} (an internal error; rerun with --verbose for the "
            f"traceback and report it)"), 1


if __name__ == "__main__":
    sys.exit(main())
