"""Where training runs (cluster/placement.py's placement_for): chosen from the config and the
Ray cluster's resources, or refused naming what the cluster lacks. Pure decisions: no cluster."""

from __future__ import annotations

import pytest

from tests.helpers import train_cfg
from tpu_ray.errors import UserError

pytestmark = pytest.mark.quick  # no training, no Ray: the `make test-quick` tier


TPU_CLUSTER = {"CPU": 8, "TPU": 8, "TPU-v4-8-head": 1, "TPU-v4-16-head": 1}


@pytest.mark.parametrize("train, resources, expected", [
    ({}, {"CPU": 8}, ("local", {})),
    ({}, {"CPU": 8, "TPU": 4, "TPU-v4-8-head": 1}, ("tpu", {"head_resource": "TPU-v4-8-head"})),
    ({"strategy": "cpu"}, {"CPU": 8, "TPU": 4, "TPU-v4-8-head": 1}, ("local", {})),  # TPU there, CPU asked
    ({"tpu_topology": "v4-16"}, TPU_CLUSTER, ("tpu", {"head_resource": "TPU-v4-16-head"})),
    ({"num_gpus": 2}, {"CPU": 8, "GPU": 4}, ("gpu", {"num_gpus": 2})),
    ({"placement": "gpu"}, {"CPU": 8, "GPU": 1}, ("gpu", {"num_gpus": 1})),
    ({"placement": "local", "tpu_topology": "v4-8"}, TPU_CLUSTER, ("local", {})),
])
def test_placement_for(train, resources, expected):
    from tpu_ray.cluster.placement import placement_for

    assert placement_for(train_cfg(**train).train, resources) == expected


@pytest.mark.parametrize("train, resources, message", [
    ({"placement": "tpu"}, TPU_CLUSTER, r"cluster has TPU head resources \['TPU-v4-16-head', 'TPU-v4-8-head'\]"),
    ({"tpu_topology": "v5p-8"}, TPU_CLUSTER, r"train.tpu_topology=v5p-8: no node offers TPU-v5p-8-head"),
    ({"num_gpus": 4}, {"CPU": 8, "GPU": 2}, r"train.num_gpus=4: the Ray cluster has 2 GPUs"),
])
def test_placement_for_refuses_what_the_cluster_cannot_give(train, resources, message):
    from tpu_ray.cluster.placement import placement_for

    from tpu_ray.errors import FailureKind

    with pytest.raises(UserError, match=message) as err:
        placement_for(train_cfg(**train).train, resources)
    assert err.value.kind is FailureKind.BAD_INPUT  # the config asks for what the cluster has not: no retry
