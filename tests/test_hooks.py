"""The training loop's execution lengths (train/hooks.py's next_length): an execution never
crosses a hook's boundary nor the run's end. Pure arithmetic."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


@pytest.mark.parametrize("step, total, spe, everies, n", [
    (0, 40, 4, [10, 20], 4), (8, 40, 4, [10, 20], 2), (10, 40, 100, [10, 20], 10),
    (38, 40, 4, [None], 2), (0, 40, 1, [7], 1), (5, 40, 64, [None, 500], 35),
])
def test_next_length(step, total, spe, everies, n):
    from tpu_ray.train.hooks import next_length

    assert next_length(step, total, spe, everies) == n
