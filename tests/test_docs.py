"""The docs stay true: every `tpu-ray`, `python` and `ray` command that README.md and
docs/*.md show is parsed here against the real parsers (each subcommand and option named exists,
each config file and override loads through the config loader), every relative link and image
resolves (anchors included), the README stays a short guide, and its test command is CI's.
Nothing trains: this is the fast check a docs edit must pass."""

from __future__ import annotations

import argparse
import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import REPO
from tpu_ray.errors import UserError

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SEPARATORS = {"&&", "||", "|", ";"}
OVERRIDE = re.compile(r"^[a-z_]+(\.[A-Za-z0-9_]+)+=")


@dataclass(frozen=True)
class Command:
    doc: str
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.doc}: {' '.join(self.words)}"


def _shell_words(text: str) -> list[list[str]]:
    """The simple commands of a shell snippet: comments dropped, `\\` lines joined, split at && ; |,
    leading VAR=value assignments and `export` lines left out."""
    text = re.sub(r"\\\n\s*", " ", text)
    text = re.sub(r"<[\w .-]+>", "PLACEHOLDER", text)  # <submission id>, <stage>: one word
    out: list[list[str]] = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True  # words stay whole (--out=x, a/b*.txt); ; && | still split
        try:
            words = list(lexer)
        except ValueError:  # an unbalanced quote in prose-like code: not a command we can parse
            continue
        current: list[str] = []
        for w in [*words, ";"]:
            if w in SEPARATORS:
                while current and re.match(r"^[A-Z_][A-Z0-9_]*=", current[0]):
                    current.pop(0)
                if current:
                    out.append(current)
                current = []
            else:
                current.append(w)
    return out


def _commands() -> list[Command]:
    """Every command shown: the lines of bash (or unlabelled) code blocks, and inline code that
    starts with a command word."""
    found: list[Command] = []
    for path in DOCS:
        text, name = path.read_text(), str(path.relative_to(REPO))
        for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
            if lang in ("bash", "sh", "shell"):  # unlabelled blocks are output (logs, tables)
                found += [Command(name, tuple(w)) for w in _shell_words(body)]
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        for span in re.findall(r"`([^`\n]+)`", prose):
            if re.match(r"^(tpu-ray|python3?|ray) [a-z-]", span) and "..." not in span.split()[1]:
                found += [Command(name, tuple(w)) for w in _shell_words(span)]
    return [c for c in found if c.words[0] in ("tpu-ray", "python", "python3", "ray")]


COMMANDS = _commands()


def _ids(commands: list[Command]) -> list[str]:
    return [str(c)[:90] for c in commands]


# --------------------------------------------------------------------------------------- tpu-ray
@cache
def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from tpu_ray.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings}


def _is_placeholder(word: str) -> bool:
    return bool(re.match(r"^(PLACEHOLDER|[A-Z][A-Z_]*(\.\.\.)?|\.\.\.|\$\w+)$", word))


def _check_overrides_and_config(cmd: Command, config: str | None, output_dir: str | None, corpus: str | None,
                                overrides: list[str]) -> None:
    from tpu_ray.config import load_run_config

    shipped = config is not None and config.startswith("jobs/")  # else a user's own (my.yaml): not ours to load
    if shipped:
        assert (REPO / config).is_file(), f"{cmd}: config file {config} does not exist"
    overrides = [o for o in overrides if not _is_placeholder(o.split("=", 1)[1] or "X")]
    load_run_config(str(REPO / config) if shipped else None, output_dir, corpus, overrides)


def _check_tpu_ray(cmd: Command, words: list[str]) -> None:
    subs = _subparsers()
    assert words, f"{cmd}: no subcommand"
    sub = words[0]
    assert sub in subs, f"{cmd}: no subcommand {sub!r} (there are: {', '.join(subs)})"
    options = _options(subs[sub])
    config = output_dir = corpus = None
    overrides: list[str] = []
    i = 1
    while i < len(words):
        w = words[i]
        if w.startswith("-") and w != "-":
            flag, _, inline = w.partition("=")
            assert flag in options or flag == "--verbose", f"{cmd}: `tpu-ray {sub}` has no option {flag}"
            action = options.get(flag)
            takes = action is not None and action.nargs != 0
            value = inline or (words[i + 1] if takes and not inline and i + 1 < len(words) else None)
            if takes and not inline:
                i += 1
            if action is not None and action.choices and value is not None and not _is_placeholder(value):
                assert value in action.choices, f"{cmd}: {flag} {value}: not one of {action.choices}"
            config = value if flag == "--config" else config
            output_dir = value if flag == "--output-dir" else output_dir
            corpus = value if flag == "--corpus" else corpus
        elif OVERRIDE.match(w):
            overrides.append(w)
        i += 1
    if "--config" in options or overrides:
        _check_overrides_and_config(cmd, config, output_dir, corpus, overrides)


# ---------------------------------------------------------------------------------------- python
def _script_flags(path: Path) -> set[str]:
    """The options a script's argparse declares, its own and those of the modules beside it that it
    imports (jobs/*.py: their shared jobs/_entry.py; benchmarks/vocabulary.py: continued.py's)."""
    sources = [path] + ([REPO / "jobs" / "_entry.py"] if path.parent.name == "jobs" else [])
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        sources += [path.parent / f"{n}.py" for n in names if (path.parent / f"{n}.py").is_file()]
    flags: set[str] = set()
    for src in sources:
        for node in ast.walk(ast.parse(src.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")}
    return flags | {"-h", "--help"}


def _check_python(cmd: Command, words: list[str]) -> None:
    if words[:1] == ["-m"]:
        module = words[1]
        if module == "tpu_ray.cli":
            _check_tpu_ray(cmd, words[2:])
        else:
            assert module in ("pytest", "venv", "pip"), f"{cmd}: unexpected module {module}"
        return
    if words[:1] == ["-c"] or not words:
        return
    if "PLACEHOLDER" in words[0]:  # jobs/<stage>.py: a pattern, not a file
        return
    script = REPO / words[0]
    assert script.is_file(), f"{cmd}: {words[0]} does not exist"
    flags = _script_flags(script)
    rest = words[1:]
    for w in rest:
        if w.startswith("--"):
            flag = w.split("=", 1)[0]
            assert flag in flags, f"{cmd}: {words[0]} has no option {flag}"
    levers = [v for k, v in zip(rest, rest[1:]) if k == "--set"]  # a benchmark's config levers, together
    if levers:
        _check_overrides_and_config(cmd, None, None, None, levers)
    if script.parent.name == "jobs" and script.suffix == ".py":
        config = rest[rest.index("--config") + 1] if "--config" in rest else None
        _check_overrides_and_config(cmd, config, None, None, [w for w in rest if OVERRIDE.match(w)])


# ------------------------------------------------------------------------------------------- ray
def _check_ray(cmd: Command, words: list[str]) -> None:
    import click
    from ray.scripts.scripts import cli

    command: click.Command = cli
    i = 0
    while isinstance(command, click.Group):
        assert i < len(words), f"{cmd}: no ray subcommand"
        if words[i] == "...":  # `ray job ...`: the group named, not a command
            return
        assert words[i] in command.commands, f"{cmd}: `ray` has no subcommand {words[i]!r}"
        command, i = command.commands[words[i]], i + 1
    opts = {o: p for p in command.params for o in [*p.opts, *p.secondary_opts]} | {"--help": None}
    rest = words[i:]
    if "--" in rest:  # `ray job submit ... -- python jobs/pretrain.py ...`: the entrypoint is a command too
        at = rest.index("--")
        _check(Command(cmd.doc, tuple(rest[at + 1:])))
        rest = rest[:at]
    for w in rest:
        if w.startswith("-"):
            flag = w.split("=", 1)[0]
            assert flag in opts, f"{cmd}: `ray {' '.join(words[:i])}` has no option {flag}"


def _check(cmd: Command) -> None:
    head, *rest = cmd.words
    if head == "tpu-ray":
        _check_tpu_ray(cmd, rest)
    elif head in ("python", "python3"):
        _check_python(cmd, rest)
    elif head == "ray":
        _check_ray(cmd, rest)


def test_the_docs_show_commands_of_every_kind():
    heads = {c.words[0] for c in COMMANDS}
    assert {"tpu-ray", "python", "ray"} <= heads and len(COMMANDS) > 40


@pytest.mark.parametrize("cmd", COMMANDS, ids=_ids(COMMANDS))
def test_every_command_shown_parses_and_its_config_loads(cmd: Command):
    _check(cmd)


def test_the_check_catches_what_it_should():
    """The parser check itself: a wrong subcommand, option, override field or config file fails."""
    for words in (("tpu-ray", "trian"), ("tpu-ray", "run", "--no-such"), ("tpu-ray", "run", "train.stpes=3"),
                  ("tpu-ray", "run", "--config", "jobs/configs/nope.yaml"), ("python", "benchmarks/learning.py", "--nope"),
                  ("ray", "job", "submit", "--nope"), ("tpu-ray", "metrics", "RUN", "--kind", "nope")):
        with pytest.raises((AssertionError, UserError)):
            _check(Command("test", words))


@pytest.mark.parametrize("path", sorted((REPO / "jobs" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path):
    from tpu_ray.config import load_run_config

    load_run_config(str(path))


# ------------------------------------------------------------- options in prose and YAML snippets
def _run_config_snippets() -> list[tuple[str, str]]:
    """(doc, body) of each ```yaml block shaped like a run config (every top key a RunConfig section)."""
    import yaml

    from tpu_ray.config import RunConfig

    out = []
    for path in DOCS:
        for body in re.findall(r"^```ya?ml\n(.*?)^```", path.read_text(), flags=re.S | re.M):
            try:
                data = yaml.safe_load(body)
            except yaml.YAMLError:  # cluster.yaml fragments (aliases defined elsewhere): not a run config
                continue
            if isinstance(data, dict) and data and set(data) <= set(RunConfig.model_fields):
                out.append((str(path.relative_to(REPO)), body))
    return out


def _prose_overrides() -> list[tuple[str, str]]:
    """(doc, key) of each `section.key=value` written in prose code spans (an option the reader copies)."""
    from tpu_ray.config import RunConfig

    out = []
    for path in DOCS:
        prose = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
        for span in re.findall(r"`([^`\n]+)`", prose):
            for word in span.split():
                if OVERRIDE.match(word) and word.split(".", 1)[0] in RunConfig.model_fields:
                    out.append((str(path.relative_to(REPO)), word.split("=", 1)[0]))
    return sorted(set(out))


SNIPPETS, PROSE_KEYS = _run_config_snippets(), _prose_overrides()


@pytest.mark.parametrize("doc, body", SNIPPETS, ids=[f"{d}:{b.split()[0]}" for d, b in SNIPPETS])
def test_every_run_config_snippet_loads(doc: str, body: str):
    """A YAML snippet of a run config names only options that exist (a typo would be ignored by no one)."""
    import yaml

    from tpu_ray.config import RunConfig

    data = yaml.safe_load(body)
    data.setdefault("output_dir", "runs/x")
    corpus = data.setdefault("corpus", {})
    if "sources" not in corpus:  # a snippet of other sections: any corpus will do
        corpus.setdefault("source", "my.txt")
    try:
        RunConfig.from_dict(data)
    except UserError as exc:
        pytest.fail(f"{doc}: the YAML snippet starting {body.split(chr(10))[0]!r} does not load: {exc}")


@pytest.mark.parametrize("doc, key", PROSE_KEYS, ids=[f"{d}:{k}" for d, k in PROSE_KEYS])
def test_every_option_written_in_prose_exists(doc: str, key: str):
    from tpu_ray.config import RunConfig, _set_dotted

    fields = RunConfig.from_dict({"output_dir": "x", "corpus": {"source": "x"}}).model_dump()
    try:
        _set_dotted(fields, key, None)
    except UserError as exc:
        pytest.fail(f"{doc}: `{key}=...`: {exc}")


def test_the_option_checks_catch_a_made_up_option():
    from tpu_ray.config import RunConfig, _set_dotted

    with pytest.raises(UserError, match="no key 'extend_tokenz'"):
        _set_dotted(RunConfig.from_dict({"output_dir": "x", "corpus": {"source": "x"}}).model_dump(),
                    "tokenizer.extend_tokenz", None)
    with pytest.raises(UserError, match="extend_tokenz"):
        RunConfig.from_dict({"output_dir": "x", "corpus": {"source": "x"}, "tokenizer": {"extend_tokenz": 5}})
    assert len(SNIPPETS) >= 4 and len(PROSE_KEYS) > 20


# ----------------------------------------------------------------------------------------- links
def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().replace("`", "").replace("*", "").lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug = _slug(heading)
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def _links() -> list[tuple[str, str]]:
    out = []
    for path in DOCS:
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
        text = re.sub(r"`[^`\n]*`", "", text)
        for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
            if not re.match(r"^[a-z]+:", target):
                out.append((str(path.relative_to(REPO)), target))
    return out


LINKS = _links()


def test_the_docs_link_to_each_other():
    assert len(LINKS) > 30 and any(t.endswith(".png") for _, t in LINKS)


@pytest.mark.parametrize("doc, target", LINKS, ids=[f"{d}->{t}" for d, t in LINKS])
def test_every_relative_link_and_image_resolves(doc: str, target: str):
    file, _, anchor = target.partition("#")
    path = (REPO / doc).parent / file if file else REPO / doc
    assert path.exists(), f"{doc}: link to {target}: {path.relative_to(REPO)} does not exist"
    if anchor and path.suffix == ".md":
        assert anchor in _anchors(path), f"{doc}: link to {target}: no heading with that anchor in {file or doc}"


# ---------------------------------------------------------------------------------------- README
def _section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_is_a_short_guide_with_every_task_in_its_contents():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    contents = _section("Contents")
    for task in ("quickstart", "own text", "mixture", "checkpoint", "cluster", "TPU slice", "Ray job",
                 "Python", "Metrics", "comparing", "Resuming", "tests", "Reference"):
        assert task in contents, task
    for page in ("schedules.md", "vocabulary.md", "mixtures.md"):  # continuing a checkpoint on a domain
        assert f"(docs/{page}" in _section("Continue a checkpoint on your domain"), page


def test_the_readmes_test_command_is_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    marker = next(i for i, line in enumerate(ci) if line.startswith("# --- README"))
    command = ci[marker + 1].strip()
    block = re.findall(r"```bash\n(.*?)```", _section("Run the tests"), flags=re.S)
    assert [line.strip() for line in block[0].splitlines()] == [command] == ["make test"]
    assert "TPU_RAY_REQUIRE_EXTRAS=1" in "\n".join(ci[:marker])


@pytest.mark.skipif(shutil.which("make") is None, reason="make absent: `apt-get install -y make`")
def test_make_test_sets_up_everything_and_runs_both_suites():
    plan = subprocess.run(["make", "-n", "-B", "test"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    steps = ['-m venv .venv', 'uv pip install -e ".[test]"', "tests/compile_bytecode.sh .venv", "apt-get install -y chromium",
             "tests/interop/setup_venvs.sh", ".venv/bin/python -m pytest -n 2 --dist loadgroup\n",
             ".venv/bin/python -m pytest -n 2 --dist loadgroup -m slow\n", "tests/tpu_set/run.sh"]
    at = [plan.find(s) for s in steps]
    assert -1 not in at and at == sorted(at), plan
    assert re.search(r"setup_venvs\.sh (\S+); then touch \1/\.built", plan), plan  # built once, where tests look


def test_a_failed_interop_build_removes_only_its_own_venvs(tmp_path):
    """TPU_RAY_INTEROP_VENVS may name a directory holding other things: a build that fails (here a
    Python that cannot make a venv) removes its t4/t5, not the directory."""
    import os

    shared = tmp_path / "venvs"
    (shared / "t5").mkdir(parents=True)
    (shared / "mine.txt").write_text("keep")
    env = {k: v for k, v in os.environ.items() if k != "TPU_RAY_REQUIRE_EXTRAS"}
    proc = subprocess.run(["make", "interop", f"INTEROP={shared}", "PYTHON=false"], cwd=REPO, capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0 and "could not be built" in proc.stdout, proc.stdout + proc.stderr
    assert (shared / "mine.txt").read_text() == "keep" and not (shared / "t5").exists()


def test_readme_and_jobs_docs_start_a_local_head_the_same_way():
    raw = {doc: [line for line in (REPO / doc).read_text().splitlines()
                 if "ray start --head" in line and line.lstrip().startswith(("ray", "RAY_"))]
           for doc in ("README.md", "docs/jobs.md")}
    assert len(raw["README.md"]) == 1 and raw["README.md"] == raw["docs/jobs.md"], raw


def test_the_own_text_example_uses_nothing_outside_the_repository():
    """A fresh clone has no ../shared/data: the README's commands never name a path outside it."""
    for cmd in COMMANDS:
        if cmd.doc == "README.md":
            assert not any(w.startswith("../") or "/shared/" in w for w in cmd.words), cmd


def test_docs_and_help_suggest_no_shared_tmp_output_dir():
    """`--output-dir /tmp/quickstart` on a shared machine is a directory anyone can create first."""
    pattern = re.compile(r"/tmp/[A-Za-z0-9_.-]+")
    files = [REPO / "README.md", REPO / "tpu_ray" / "cli.py", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "jobs").rglob("*.py")), *sorted((REPO / "jobs").rglob("*.yaml"))]
    found = [f"{p.relative_to(REPO)}: {m}" for p in files for m in pattern.findall(p.read_text())]
    assert not found, found
    out = subprocess.run([sys.executable, "-m", "tpu_ray.cli", "--help"], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and "runs/quickstart" in out.stdout and "/tmp/" not in out.stdout
