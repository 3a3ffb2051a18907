"""Cluster on real Ray: start or attach, node ranks, accelerators, clear errors."""

from __future__ import annotations

import os

import pytest
import ray
from ray.cluster_utils import Cluster as RayTestCluster

from rlinf.sched import Cluster, ClusterError


@pytest.fixture
def no_ray():
    assert not ray.is_initialized()
    yield
    if ray.is_initialized():
        ray.shutdown()


def test_starts_a_local_cluster_and_stops_it(no_ray) -> None:
    with Cluster(num_nodes=1, num_cpus=2) as cluster:
        assert cluster.owns_ray and ray.is_initialized()
        info = cluster.info
        assert info.num_nodes == 1 and info.nodes[0].node_rank == 0
        assert info.num_accelerators == 0, "CPU-only nodes are normal"
        assert info.nodes[0].num_cpus == 2
        assert set(info.node_groups) == {"cluster", "node"}
        # Workers run at the driver's priority, not Ray's default nice 15 (which
        # starves them on a busy machine).
        assert ray.get(ray.remote(lambda: os.nice(0)).remote()) == os.nice(0)
        # A second Cluster (as a worker would build) attaches and leaves Ray running.
        inner = Cluster()
        assert not inner.owns_ray
        inner.close()
        assert ray.is_initialized()
    assert not ray.is_initialized()


def test_a_run_without_a_namespace_gets_its_own(no_ray, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs on one machine must not share channel names (/dev/shm is machine-wide)."""
    from rlinf.core.channel import NAMESPACE_ENV, Channel, default_namespace

    monkeypatch.delenv(NAMESPACE_ENV, raising=False)
    with Cluster(num_nodes=1, num_cpus=1):
        first = default_namespace()
        assert first.startswith("run-") and os.environ[NAMESPACE_ENV] == first
        # Worker groups hand default_namespace() to every rank's environment.
        channel = Channel.create("ns-check")
        assert channel.namespace == first
    assert NAMESPACE_ENV not in os.environ
    with Cluster(num_nodes=1, num_cpus=1):
        assert default_namespace().startswith("run-") and default_namespace() != first
    monkeypatch.setenv(NAMESPACE_ENV, "mine")
    with Cluster(num_nodes=1, num_cpus=1):
        assert default_namespace() == "mine"  # an explicit one is kept
    assert os.environ[NAMESPACE_ENV] == "mine"


def test_missing_nodes_fail_with_a_clear_message(no_ray) -> None:
    with pytest.raises(
        ClusterError, match=r"waited 1 s for 3 nodes but 1 joined.*lower cluster.num_nodes"
    ):
        Cluster(num_nodes=3, num_cpus=1, timeout=1)


def test_bad_arguments(no_ray) -> None:
    with pytest.raises(ValueError, match="num_nodes must be >= 1"):
        Cluster(num_nodes=0)


@pytest.fixture
def two_nodes(monkeypatch):
    """Two Ray "nodes" on this machine; the head says RLINF_NODE_RANK=1, the other 0."""
    assert not ray.is_initialized()
    monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # as Cluster does when it starts Ray
    test_cluster = RayTestCluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "env_vars": {"RLINF_NODE_RANK": "1"},
        },
    )
    worker = test_cluster.add_node(num_cpus=1, env_vars={"RLINF_NODE_RANK": "0"})
    try:
        yield test_cluster, worker
    finally:
        if ray.is_initialized():
            ray.shutdown()
        test_cluster.shutdown()


def test_node_ranks_come_from_rlinf_node_rank(two_nodes) -> None:
    test_cluster, worker = two_nodes
    cluster = Cluster(num_nodes=2, address=test_cluster.address, timeout=60)
    try:
        assert not cluster.owns_ray
        ranks = [n.node_rank for n in cluster.info.nodes]
        assert ranks == [0, 1]
        # Rank 0 is the node started with RLINF_NODE_RANK=0 (not the head).
        assert cluster.info.nodes[0].ray_node_id == worker.node_id
        assert cluster.info.node_groups["node"].node_ranks == (0, 1)
    finally:
        cluster.close()
