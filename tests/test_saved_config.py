"""Which config a run directory belongs to (saved_config.py's check_config): fields that follow the
checkpoint a continued run starts from are no reason to refuse its own tokenizer and shards."""

from __future__ import annotations

import pytest

from tpu_ray.config import RunConfig
from tpu_ray.errors import UserError

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def test_a_continued_run_saved_before_its_config_recorded_the_checkpoints_tokenizer_still_resumes(tmp_path):
    """A continued run's config.yaml takes tokenizer.kind / vocab_size and model.preset from the
    checkpoint; one saved before it did held the defaults there. Those fields follow the checkpoint (pinned
    by model.init_sha256), so they are no reason to refuse the run's own tokenizer and shards; any
    other run changing them still is."""
    from tpu_ray.saved_config import check_config, save_config

    for init_from, refused in (("runs/quickstart/model", False), (None, True)):
        run = tmp_path / str(refused)
        before = RunConfig.from_dict({"output_dir": str(run), "model": {"init_from": init_from}})
        save_config(before, False, {})
        (run / "tokenizer").mkdir(parents=True)
        (run / "tokenizer" / "tokenizer.json").write_text("{}")
        now = before.override({"tokenizer.kind": "bpe", "tokenizer.vocab_size": 2000, "model.preset": "mini"})
        if refused:
            with pytest.raises(UserError, match="tokenizer.kind"):
                check_config(now)
        else:
            assert check_config(now) is True  # config.yaml rewritten with what the run trains
