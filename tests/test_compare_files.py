"""`tpu-ray compare` commits its files (plots, page) by rename: a link planted in --out is replaced,
never written through. The runs are test_compare.py's."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


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
