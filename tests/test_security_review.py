"""Issue 46: nothing lost, no one let in (second review). A run's records cannot write outside
it, a borrowed shard set stays its owner's, no open port without saying so, private run
directories checked without following links, one redaction for every file, log and error line,
a lost gs:// lock stops its writer, a model directory's links are not followed, and `compare`
commits its files by rename."""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest

from tpu_ray.errors import DamagedRunDir, UserError


# --- 5. one redaction for files, logs and error lines --------------------------------------------
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


# --- 4. the run-directory privacy check: no link, a parent of ours ----------------------------
@pytest.mark.quick
def test_a_run_dir_planted_as_a_link_to_a_directory_of_ours_is_refused(tmp_path):
    """In a shared sticky parent another user plants RUN -> a directory the victim owns; `os.stat`
    followed the link and the check passed."""
    from tpu_ray.runlock import RunLock

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    (shared / "run").symlink_to(victim)
    with pytest.raises(UserError, match=r"run: is a symbolic link \(to .*victim\).*--output-dir") as err:
        RunLock(str(shared / "run"), "tpu-ray run").acquire()
    assert "\n" not in str(err.value) and os.listdir(victim) == []


@pytest.mark.quick
@pytest.mark.skipif(os.getuid() != 0, reason="making a directory of another user needs root (chown)")
def test_a_run_dir_whose_parent_another_user_owns_is_refused(tmp_path):
    from tpu_ray.runlock import RunLock

    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, 4242, 4242)  # mode 0755: only they can write it, and so rename our run away
    with pytest.raises(UserError, match=r"its parent .*theirs belongs to another user \(uid 4242\)") as err:
        RunLock(str(parent / "run"), "tpu-ray run").acquire()
    assert "\n" not in str(err.value)
    os.chown(parent, os.getuid(), os.getgid())
    with RunLock(str(parent / "run"), "tpu-ray run"):
        pass


# --- 8. `tpu-ray compare` commits its files by rename ------------------------------------------
@pytest.mark.quick
def test_compare_replaces_a_planted_link_in_out_instead_of_writing_through_it(tmp_path):
    """A `compare_loss.png` link planted in --out turned its target file into a PNG."""
    from tests.test_compare import BASE, _run
    from tpu_ray.comparison import PAGE, PLOTS, write_comparison

    runs = [_run(tmp_path / "a", BASE, "set1"), _run(tmp_path / "b", BASE, "set1", scale=0.9)]
    out = tmp_path / "out"
    out.mkdir()
    victims = {}
    for name in (*PLOTS, PAGE):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text("keep me\n")
        (out / name).symlink_to(victims[name])
    paths = write_comparison(runs, str(out))
    for name, victim in victims.items():
        assert victim.read_text() == "keep me\n", name
        assert not os.path.islink(paths[name]) and os.path.getsize(paths[name]) > 100
