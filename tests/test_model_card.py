"""The exported model's card (train/export_safetensors.py's model_card): it says how to call the model
where the plain call fails, and never shows a password of the corpus URL."""

from __future__ import annotations

import pytest

from tpu_ray.config import RunConfig

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def test_the_model_card_explains_the_torch_name_error_where_it_gives_the_call():
    """The plain pipeline("fill-mask", model=...) fails in tpu-ray's own environment (no torch) with
    NameError: torch, which only docs/run-directory.md explained; the model card says so too."""
    from tpu_ray.train.export_safetensors import model_card, run_record

    card = model_card(run_record(RunConfig.from_dict({})), 10, 800, "roberta", mask="<mask>")
    use = card[card.index("## Use"):card.index("## The run's config")]
    assert "NameError: name 'torch' is not defined" in use and 'framework="tf", dtype=None' in use


def test_model_card_never_shows_a_corpus_password(tmp_path):
    from tests.helpers import tiny_config
    from tpu_ray.train.export_safetensors import model_card, run_record

    cfg = tiny_config(tmp_path / "run", "https://alice:s3cr3t@host/corpus.txt")
    card = model_card(run_record(cfg), 10, 800, "roberta")
    assert "s3cr3t" not in card and "https://alice:***@host/corpus.txt" in card
