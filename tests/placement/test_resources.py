"""GPU list parsing: every accepted form, and each bad entry names the field and the fix."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hybridflow.config import ClusterConfig
from hybridflow.errors import UserError
from hybridflow.placement import parse_gpu_list

TWO_NODES = ClusterConfig(nodes=2, gpus_per_node=8, gpu_type="H100")
F = "placement.resources.actor"


@pytest.mark.parametrize(
    "entries, ranks",
    [
        ([0, 1, 2, 3], (0, 1, 2, 3)),
        ([3, 1], (3, 1)),
        (["0-3"], (0, 1, 2, 3)),
        (["5"], (5,)),
        (["all"], tuple(range(16))),
        (["node0:[0,1,2,3]"], (0, 1, 2, 3)),
        (["node1:[0,1]"], (8, 9)),
        (["node1:[0, 2-3]"], (8, 10, 11)),
        (["node1:2-4"], (10, 11, 12)),
        (["node1:all"], tuple(range(8, 16))),
        (["node0:7", "node1:0"], (7, 8)),
        ([0, "node1:[0,1]", "2-3"], (0, 8, 9, 2, 3)),
    ],
)
def test_accepted_forms(entries, ranks):
    assert parse_gpu_list(entries, TWO_NODES, F) == ranks


@pytest.mark.parametrize(
    "entries, match",
    [
        ([16], r"^placement\.resources\.actor: GPU 16 is out of range for 16 GPUs .*use 0\.\.15"),
        (["0-16"], r"GPU 16 is out of range"),
        (
            ["node2:[0]"],
            r"^placement\.resources\.actor: node2 does not exist \(cluster\.nodes=2\); use node0\.\.node1",
        ),
        (["node1:[8]"], r"node1 GPU 8 is out of range \(gpus_per_node=8\); use 0\.\.7"),
        ([1, 1], r"^placement\.resources\.actor: GPU 1 is listed twice; list each GPU once"),
        (["0-3", 2], r"GPU 2 is listed twice"),
        (["node0:[0,1]", 1], r"GPU 1 is listed twice"),
        (["gpu0"], r"cannot read 'gpu0'"),
        (["3-1"], r"cannot read '3-1'"),
        ([], r"empty GPU list"),
        ([1.5], r"1\.5 is not a GPU"),
    ],
)
def test_bad_entries(entries, match):
    with pytest.raises(UserError, match=match):
        parse_gpu_list(entries, TWO_NODES, F)


@given(
    nodes=st.integers(1, 4),
    gpn=st.sampled_from([1, 2, 4, 8]),
    data=st.data(),
)
def test_node_local_form_maps_to_global_ranks(nodes, gpn, data):
    cluster = ClusterConfig(nodes=nodes, gpus_per_node=gpn, gpu_type="H100")
    node = data.draw(st.integers(0, nodes - 1))
    local = data.draw(st.lists(st.integers(0, gpn - 1), min_size=1, unique=True))
    text = f"node{node}:[{','.join(map(str, local))}]"
    assert parse_gpu_list([text], cluster, F) == tuple(node * gpn + i for i in local)
