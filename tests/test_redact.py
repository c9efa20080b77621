"""One redaction (redact.py) for every file, log and error line: a URL's password or signed token is
hidden in every form it is written in (plain, YAML, JSON, repr), the plan still opens the real URL,
and a run read over HTTP with a password in its URL keeps it in none of its files. The last test
prepares a real run on the local Ray cluster (default tier); the others are quick."""

from __future__ import annotations

import json
import logging
import sys

import pytest


@pytest.mark.quick
@pytest.mark.parametrize("url, secret", [
    ("https://alice:pa'ss@host/a.txt", "pa'ss"),
    ('https://alice:pa"ss@host/a.txt', 'pa"ss'),
    ("https://alice:p@ssw0rd@host/a.txt", "ssw0rd"),
    ("https://storage.googleapis.com/b/o.txt?X-Goog-Algorithm=GOOG4&X-Goog-Signature=abc123def&x=1", "abc123def"),
    ("https://host/o.txt?token=hf_tok3n", "hf_tok3n"),
    ("https://acct.blob.core.windows.net/c/o.txt?sv=2020&sig=S1GNED", "S1GNED"),
])
def test_redaction_hides_quoted_at_signed_and_token_credentials_in_every_form(url, secret):
    """Quotes made the old pattern skip the URL, `@` leaked the part after it, query tokens were
    never hidden; YAML (config.yaml) and JSON (run_info.json, plan.json) forms included."""
    import yaml

    from tpu_ray.redact import redact, unredact

    for form in (url, yaml.safe_dump({"corpus": url}), json.dumps({"command": f"tpu-ray run {url}"}), repr(url)):
        assert secret not in redact(form), form
    plan = redact(json.dumps({"files": [url]}))
    assert json.loads(unredact(plan, [url]))["files"] == [url]  # the plan still opens the real URL


@pytest.mark.quick
def test_redact_keeps_the_user_and_hides_the_password():
    from tpu_ray.redact import redact, redact_obj, unredact

    assert redact("https://alice:s3cr3t@host/a.txt") == "https://alice:***@host/a.txt"
    assert redact("corpus https://TOKEN@github.com/x and gs://bucket/o@1") == \
        "corpus https://***@github.com/x and gs://bucket/o@1"
    assert redact("mail me@example.com, hf:wikitext") == "mail me@example.com, hf:wikitext"
    assert redact_obj({"a": ["http://u:p@h/x", 1]}) == {"a": ["http://u:***@h/x", 1]}
    assert unredact("read http://u:***@h/x", ["http://u:p@h/x"]) == "read http://u:p@h/x"


@pytest.mark.quick
def test_log_lines_and_the_cli_error_line_keep_no_password(tmp_path, capsys):
    """`tpu-ray shard --corpus https://user:secret@127.0.0.1:9/x.txt` printed `user:secret`."""
    from tpu_ray.cli import main
    from tpu_ray.logs import setup_logging

    setup_logging()
    logging.getLogger("tpu_ray.test").warning("reading %s", "https://bob:hunter2@host/x?X-Goog-Signature=ff00")
    code = main(["shard", "--corpus", "https://user:secret@127.0.0.1:9/x.txt", "--output-dir", str(tmp_path / "r"),
                 "ray.address=local"])
    err = capsys.readouterr().err
    assert code in (1, 2) and "tpu-ray: error:" in err, err
    assert "user:***@127.0.0.1" in err or "127.0.0.1:9" in err, err
    assert "secret" not in err and "hunter2" not in err and "ff00" not in err, err


@pytest.fixture
def http_corpus(small_corpus):
    """The small corpus served over HTTP on loopback (credentials in the URL are ignored by it)."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def handle(self):
            try:
                super().handle()
            except (BrokenPipeError, ConnectionResetError):  # a ranged reader closing early
                pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Quiet, directory=str(small_corpus.parent)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://alice:s3cr3t@127.0.0.1:{server.server_address[1]}/{small_corpus.name}"
    server.shutdown()
    server.server_close()


def test_a_password_in_the_corpus_url_is_in_no_file_of_the_run(tmp_path, http_corpus, ray_local, monkeypatch):
    """config.yaml, run_info.json (the command), plan.json, the manifest, summary.json and the
    metrics used to hold `alice:s3cr3t` verbatim; the resumed stage still reads the corpus."""
    from tests.helpers import tiny_config
    from tpu_ray.pipeline import Pipeline
    from tpu_ray.report import write_report

    monkeypatch.setattr(sys, "argv", ["tpu-ray", "prepare", "--corpus", http_corpus])
    cfg = tiny_config(tmp_path / "run", http_corpus)
    Pipeline(cfg).prepare()
    Pipeline(cfg).shard()  # plan.json read back (credentials restored) and the shards reused
    write_report(cfg.run_dir)
    leaked = [str(p.relative_to(tmp_path)) for p in (tmp_path / "run").rglob("*")
              if p.is_file() and b"s3cr3t" in p.read_bytes()]
    assert not leaked, leaked
    assert "http://alice:***@127.0.0.1" in (tmp_path / "run" / "config.yaml").read_text()
    assert "alice:***@" in json.loads((tmp_path / "run" / "run_info.json").read_text())["command"]
