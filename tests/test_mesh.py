"""The parallel state: one DeviceMesh with named dims, derived dims, and the query API, on 1, 2 and 4
gloo processes; size validation messages name the config field."""

from __future__ import annotations

import pytest

from omnicore.parallel.mesh import FLAT_DIMS, MESH_DIMS, MeshError, MeshLayout
from omnicore.testing.distributed import DistributedTestError, run_distributed

ALL_DIMS = MESH_DIMS + tuple(FLAT_DIMS)


def query(parallel: dict) -> dict:
    """What a rank sees: per dim its size, index, group ranks (from the DeviceMesh and from the
    layout), and an all_reduce of the ranks over the dim's group."""
    import torch
    import torch.distributed as dist

    from omnicore.parallel.state import init_parallel_state

    state = init_parallel_state("cpu", "gloo", parallel)
    out = {"rank": state.rank, "dp_rank": state.dp_rank, "dp_size": state.dp_size, "fsdp_mesh": tuple(state.fsdp_mesh().shape)}
    for d in ALL_DIMS:
        t = torch.tensor([float(state.rank)])
        dist.all_reduce(t, group=state.group(d))
        sub = state.submesh(d)
        out[d] = {
            "size": state.size(d),
            "index": state.rank_in(d),
            "mesh_index": sub.get_local_rank(),
            "mesh_ranks": sub.mesh.flatten().tolist(),
            "ranks": state.group_ranks(d),
            "sum": t.item(),
            "via_state": state.all_reduce_sum(1, dim=d),
        }
    return out


def fail_on_rank_one() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("rank one says no")
    dist.barrier()  # rank 0 waits here forever; the harness must stop it


def _check(results: list[dict], layout: MeshLayout) -> None:
    for r, got in enumerate(results):
        assert got["rank"] == r
        assert got["dp_rank"] == layout.dp_rank(r) and got["dp_size"] == layout.dp_size
        for d in ALL_DIMS:
            q = got[d]
            assert q["mesh_ranks"] == q["ranks"] == layout.group_of(d, r), d
            assert q["size"] == layout.size(d) == len(q["ranks"]) == q["via_state"], d
            assert q["index"] == q["mesh_index"] == q["ranks"].index(r), d
            assert q["sum"] == sum(q["ranks"]), d


def test_one_process_state_answers_without_a_process_group():
    from omnicore.parallel.state import init_parallel_state

    state = init_parallel_state("cpu", "gloo", {"dp_shard": -1})
    assert not state.distributed and state.mesh is None
    for d in ALL_DIMS:
        assert state.size(d) == 1 and state.rank_in(d) == 0 and state.group(d) is None and state.group_ranks(d) == [0]
    assert (state.dp_rank, state.dp_size) == (0, 1) and state.fsdp_mesh() is None
    assert state.all_reduce_sum(3.5, dim="dp") == 3.5


@pytest.mark.multiprocess
def test_two_processes_fsdp_and_sp_layouts():
    for parallel in ({"dp_shard": -1}, {"dp_shard": 1, "sp": 2}):
        layout = MeshLayout.from_config(parallel, 2)
        _check(run_distributed(query, 2, args=(parallel,)), layout)
    # ranks that differ only in sp read the same data; FSDP shards over sp too
    assert layout.dp_size == 1 and layout.groups("fsdp") == [[0, 1]] and layout.groups("sp") == [[0, 1]]


@pytest.mark.multiprocess
def test_four_processes_hsdp_2x2_groups():
    parallel = {"dp_replicate": 2, "dp_shard": -1}
    layout = MeshLayout.from_config(parallel, 4)
    results = run_distributed(query, 4, args=(parallel,))
    _check(results, layout)
    assert layout.groups("dp_replicate") == [[0, 2], [1, 3]] and layout.groups("dp_shard") == [[0, 1], [2, 3]]
    assert all(r["fsdp_mesh"] == (2, 2) for r in results)


def test_layout_arithmetic_for_composed_dims():
    L = MeshLayout.from_config({"dp_replicate": 2, "dp_shard": 2, "ep": 2, "sp": 2}, 16)
    assert L.shape == (2, 2, 2, 2)
    assert L.group_of("sp", 5) == [4, 5] and L.group_of("ep", 5) == [5, 7]
    assert L.group_of("dp", 0) == [0, 2, 4, 6, 8, 10, 12, 14]  # sp-partners share data
    assert L.dp_rank(4) == L.dp_rank(5) == 2 and L.dp_size == 8
    assert L.size("fsdp") == 8 and L.size("dp_shard_sp") == 4
    assert MeshLayout.from_config({"sp": 2, "dp_shard": -1}, 8).sizes == {"dp_replicate": 1, "dp_shard": 4, "ep": 1, "sp": 2}


@pytest.mark.parametrize(
    "parallel, world, message",
    [
        (
            {"dp_shard": 3},
            4,
            "parallel: parallel.dp_replicate x parallel.dp_shard x parallel.ep x parallel.sp = 1 x 3 x 1 x 1 = 3, but the world size is 4; make the product 4 (for example parallel.dp_shard: 4, or -1 to fill the rest)",
        ),
        (
            {"sp": 3},
            4,
            "parallel.dp_shard: is -1 (the rest) but the world size 4 is not divisible by dp_replicate=1, ep=1, sp=3 (product 3)",
        ),
        ({"sp": 0}, 2, "parallel.sp: is 0; a size must be a positive integer, or -1 for the rest of the world size"),
        ({"sp": -1}, 2, "parallel.dp_shard, parallel.sp are all -1; only one dim can take the rest"),
    ],
)
def test_size_errors_name_the_field_and_the_fix(parallel, world, message):
    with pytest.raises(MeshError) as exc:
        MeshLayout.from_config(parallel, world)
    assert message in str(exc.value)


@pytest.mark.multiprocess
def test_harness_reports_a_failing_rank_traceback():
    with pytest.raises(DistributedTestError) as exc:
        run_distributed(fail_on_rank_one, 2, timeout=60)
    text = str(exc.value)
    assert "rank 1 raised" in text and "RuntimeError: rank one says no" in text and "fail_on_rank_one" in text
