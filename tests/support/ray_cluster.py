"""A local Ray cluster of simulated nodes, all on 127.0.0.1 (tests/ray_cluster/).

Ray replaces a loopback bootstrap address by the host's own address unless
it is told that no real cluster is wanted (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
makes its node address 127.0.0.1), so every process of these tests, Ray's and
envd's, binds loopback only.  Import this module before Ray.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

if os.environ.get("ENVD_RAY_TESTS"):
    # .ci/run runs tests/ray_cluster in a virtualenv of its own with the rllib
    # extra (RLlib pins gymnasium): there Ray's absence fails, never skips.
    import ray
else:
    ray = pytest.importorskip("ray", reason="the Ray tests need the ray extra: pip install "
                              "'envd-rl[ray]'")
    if getattr(ray, "__file__", None) is None:  # /tmp/ray (Ray's temp dir) as a namespace
        pytest.skip("the Ray tests need the ray extra: pip install 'envd-rl[ray]'",
                    allow_module_level=True)


@contextlib.contextmanager
def local_cluster(num_nodes: int, cpus_per_node: int = 1) -> Iterator[object]:
    """num_nodes Ray nodes on 127.0.0.1 (the head included), this process the driver."""
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": cpus_per_node, "node_ip_address": "127.0.0.1",
                                      "include_dashboard": False})
    try:
        for _ in range(num_nodes - 1):
            cluster.add_node(num_cpus=cpus_per_node, node_ip_address="127.0.0.1")
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
