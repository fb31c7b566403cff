"""Per-role megatron-core process groups over an arbitrary list of global ranks.

Each role (actor, critic, ...) gets its own TP/CP/DP/PP groups, built from megatron-core's `HyperCommGrid`
and handed to megatron-core as a `ProcessGroupCollection` (`GPTModel(pg_collection=...)`,
`DistributedDataParallel(pg_collection=...)`, `get_megatron_optimizer(pg_collection=...)`,
`get_forward_backward_func(pp_size=...)` + `forward_backward_func(pg_collection=...)`). Nothing here
touches megatron's global `parallel_state` groups, so two roles with different meshes can live on the same
ranks in one process.

Rank order inside a role is tp fastest, then cp, then dp, then pp (megatron's "tp-cp-ep-dp-pp" and the
planner's RoleMesh): the role rank at position `tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank))` of
`ranks` has those coordinates.

Collective semantics: creating a torch.distributed group is collective over the *whole world*, so every
rank must call `build_role_groups` for every role, with the same arguments, in the same order, even for
roles it is not part of. Ranks outside `ranks` get `None` back. Groups with the same ranks are one group
(`group_pool`), whichever role or name asked for them first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.hyper_comm_grid import HyperCommGrid
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

from megatron_adapters.group_pool import shared_group

# HyperCommGrid dim names, fastest-varying first.
GRID_DIMS = ["tp", "cp", "dp", "pp"]


def role_rank_enumeration(ranks: Sequence[int], tp: int, pp: int, dp: int, cp: int = 1) -> dict:
    """The global-rank lists of every group `build_role_groups` creates, keyed by group name.

    HyperCommGrid only spans a contiguous window `[rank_offset, rank_offset + size)`. To accept any rank
    list (e.g. actor on [0, 2], critic on [1, 3]), the grid enumerates *positions* 0..n-1 and positions
    are mapped through `ranks`; for a contiguous `ranks` this is exactly what
    `HyperCommGrid(rank_offset=ranks[0])` enumerates.
    """
    ranks = list(ranks)
    _check_sizes(ranks, tp, pp, dp, cp)
    grid = HyperCommGrid([tp, cp, dp, pp], GRID_DIMS, rank_offset=0)

    def enum(dims: str | list[str]) -> list[list[int]]:
        return [[ranks[pos] for pos in group] for group in grid.get_rank_enum(dims)]

    pp_groups = enum("pp")
    return {
        "tp": enum("tp"),
        "cp": enum("cp"),
        "dp": enum("dp"),
        "pp": pp_groups,
        "tp_cp": enum(["tp", "cp"]),
        "dp_cp": enum(["cp", "dp"]),
        "mp": enum(["tp", "pp"]),
        "tp_dp_cp": enum(["tp", "cp", "dp"]),
        "role": enum(["tp", "cp", "dp", "pp"]),
        # Tied input/output embeddings live on the first and last stage; their grads are all-reduced there.
        "embd": [sorted({group[0], group[-1]}) for group in pp_groups],
        "pos_embd": [[group[0]] for group in pp_groups],
        "ep": [[rank] for rank in ranks],
    }


def build_role_groups(
    ranks: Sequence[int], tp: int, pp: int, dp: int, cp: int = 1
) -> ProcessGroupCollection | None:
    """Create one role's process groups (collective over the world) and return this rank's collection.

    Args:
        ranks: the role's global ranks, in role order (tp fastest, then cp, dp, pp).
        tp, pp, dp, cp: parallel sizes; `tp * cp * dp * pp` must equal `len(ranks)`.

    Returns the `ProcessGroupCollection` with tp, cp, dp, pp, tp_cp, dp_cp, mp, tp_dp_cp, embd, pos_embd,
    ep (size 1: dense models), the expert groups aliased to their dense equivalents (expt_tp=tp,
    expt_dp=dp, tp_ep=tp, tp_ep_pp=mp; megatron's DDP and optimizer require the fields), and
    intra_dist_opt (the whole role: the distributed optimizer's grad-norm group); or `None` on ranks that
    are not in `ranks`. Every rank must call this for every role in the same order (see module docstring).
    """
    ensure_global_memory_buffer()
    me = dist.get_rank()
    groups = {}
    for name, enumeration in role_rank_enumeration(ranks, tp, pp, dp, cp).items():
        # one pass per enumeration, the same on every rank; a rank list asked for before (another name, another
        # role on the same ranks) gets the same group back: no second communicator (group_pool)
        mine = None
        for group_ranks in enumeration:
            group = shared_group(group_ranks)
            if me in group_ranks:
                mine = group
        groups[name] = mine
    if me not in ranks:
        return None
    return ProcessGroupCollection(
        tp=groups["tp"],
        cp=groups["cp"],
        dp=groups["dp"],
        pp=groups["pp"],
        tp_cp=groups["tp_cp"],
        dp_cp=groups["dp_cp"],
        mp=groups["mp"],
        tp_dp_cp=groups["tp_dp_cp"],
        embd=groups["embd"],
        pos_embd=groups["pos_embd"],
        ep=groups["ep"],
        expt_tp=groups["tp"],
        expt_dp=groups["dp"],
        tp_ep=groups["tp"],
        tp_ep_pp=groups["mp"],
        intra_dist_opt=groups["role"],
    )


def seed_role_rng(seed: int, pg_collection: ProcessGroupCollection) -> None:
    """Seed torch and megatron's tensor-parallel RNG tracker for one role.

    The tracker (dropout in TP regions, GPU weight init) is a process-wide megatron singleton; the TP rank
    is taken from the role's own tp group, not from `parallel_state`. Call it before building (or running)
    the role's model; colocated roles re-seed it when they take turns.
    """
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(
        seed, tp_rank=pg_collection.tp.rank(), ep_rank=0, etp_rank=0, force_reset_rng=True
    )


def ensure_global_memory_buffer() -> None:
    """Create megatron's process-wide scratch buffer once (not role-specific).

    `transformer/dot_product_attention.py:DotProductAttention.forward` and the TP linear layers take
    scratch tensors from `parallel_state.get_global_memory_buffer()`, which `initialize_model_parallel`
    would normally create; with explicit process groups nothing else does.
    """
    if parallel_state._GLOBAL_MEMORY_BUFFER is None:
        parallel_state._set_global_memory_buffer()


def _check_sizes(ranks: list[int], tp: int, pp: int, dp: int, cp: int) -> None:
    sizes = {"tp": tp, "pp": pp, "dp": dp, "cp": cp}
    for name, size in sizes.items():
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"{name}: must be a positive integer, got {size!r}")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"ranks: {ranks} has duplicates; list each global rank once")
    if tp * pp * dp * cp != len(ranks):
        raise ValueError(
            f"ranks: {len(ranks)} ranks but tp*cp*dp*pp = {tp}*{cp}*{dp}*{pp} = {tp * cp * dp * pp}; "
            f"give as many ranks as the product of the parallel sizes"
        )
    world = dist.get_world_size() if dist.is_initialized() else None
    if world is not None and any(not 0 <= r < world for r in ranks):
        raise ValueError(f"ranks: {ranks} has ranks outside the world of size {world}")
