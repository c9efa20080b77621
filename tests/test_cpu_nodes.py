"""CPU actors' node selector (cluster/cpu_nodes.py): sharding actors kept off TPU hosts unless
the cluster has nothing else. Node lists as Ray reports them, no cluster."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


def test_cpu_actors_avoid_tpu_hosts_unless_there_is_nothing_else():
    from tpu_ray.cluster.cpu_nodes import off_tpu_options

    cpu = {"Alive": True, "Labels": {}, "Resources": {"CPU": 8}}
    tpu = {"Alive": True, "Labels": {"ray.io/accelerator-type": "TPU-V4"}, "Resources": {"CPU": 240, "TPU": 4}}
    selector = off_tpu_options([cpu, tpu])["label_selector"]["ray.io/accelerator-type"]
    assert selector.startswith("!in(") and "TPU-V4" in selector and "TPU-V5P" in selector
    assert off_tpu_options([tpu]) == {}
    assert "label_selector" in off_tpu_options([{"Alive": True, "Labels": {}, "Resources": {"CPU": 0}}, tpu])
