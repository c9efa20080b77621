"""A mixture's weights are relative: the log line (train/mixture.py's shares_line) prints the share
each weight gives, at every step of the weight schedule. No training."""

from __future__ import annotations

import pytest

from tpu_ray.config import RunConfig

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def test_relative_weights_are_printed_as_the_shares_they_give():
    """Before, `weight: 9` beside `0.1` trained 98.9% / 1.1% without a word (the docs called a
    weight "the share")."""
    from tpu_ray.train.mixture import mixture_for, shares_line

    cfg = RunConfig.from_dict({"corpus": {"sources": {"domain": {"source": "d.txt", "weight": 9},
                                                      "general": {"source": "g.txt", "weight": 0.1}},
                                          "weight_schedule": [{"step": 100, "weights": {"general": 1}}]}})
    line = shares_line(cfg.corpus, mixture_for(cfg.corpus, {"domain": 50, "general": 50}, seed=0))
    assert "weights are relative" in line
    assert "from step 0: domain 9 -> 98.9%, general 0.1 -> 1.1%" in line
    assert "from step 100: domain 9 -> 90.0%, general 1 -> 10.0%" in line
