"""Hugging Face Hub sources (prepare/tabular.py's hub_data_files): an unreachable or offline Hub is one
line naming the config field that points at it, at once rather than after the client's retries."""

from __future__ import annotations

import os

import pytest

from tpu_ray.errors import UserError

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def test_a_hub_source_that_cannot_be_reached_names_its_own_field(tmp_path):
    """"...; point corpus.source at them" for a mixture's corpus.sources.general_test.source; and
    without HF_HUB_OFFLINE an unreachable Hub took ~25 s of datasets' retries before the error."""
    import socket
    import subprocess
    import sys

    from tpu_ray.prepare.tabular import hub_data_files

    field = "corpus.sources.general_test.source"
    with pytest.raises(UserError) as err:  # the suite runs with HF_HUB_OFFLINE=1
        hub_data_files("wikitext", "wikitext-2-v1", "test", field)
    assert f"point {field} at them" in str(err.value) and "HF_HUB_OFFLINE is set" in str(err.value), err.value
    with socket.socket() as s:  # a port nothing listens on: the Hub's endpoint refuses at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    code = (f"from tpu_ray.prepare.tabular import hub_data_files\n"
            f"try: hub_data_files('wikitext', 'wikitext-2-v1', 'test', {field!r})\n"
            f"except Exception as exc: print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "HF_ENDPOINT": f"http://127.0.0.1:{port}"}, cwd=tmp_path)
    assert (f"the Hugging Face Hub is not reachable (127.0.0.1:{port}: Connection refused)" in out.stdout
            and f"point {field} at them" in out.stdout), out.stdout + out.stderr
