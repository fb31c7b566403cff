"""Human-readable plan: role meshes, then one row per GPU with its memory by part (GiB)."""

from __future__ import annotations

from dataclasses import fields

from hybridflow.placement.host_memory import HostMemoryEstimate
from hybridflow.placement.memory import GIB
from hybridflow.placement.planner import Plan

_PARTS = ("weights", "grads", "optimizer", "activations", "kv_cache")


def _short(ranks: tuple[int, ...]) -> str:
    if len(ranks) > 2 and list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def set_label(roles: tuple[str, ...]) -> str:
    return "{" + ", ".join(roles) + "}"


def set_memory_bytes(plan: Plan) -> dict[str, int]:
    """Per colocation set, the most any of its GPUs holds: the figure the auto search's explanation
    prints, taken from the same per-GPU estimates as the table below (so the two cannot disagree)."""
    out = {}
    for roles in plan.colocation_sets:
        ranks = {r for role in roles for r in plan.meshes[role].ranks}
        out[set_label(roles)] = max(plan.memory[r].total for r in ranks)
    return out


def plan_summary(plan: Plan) -> str:
    """One line: GPU count and each role's layout and GPUs (the run's header)."""
    roles = ", ".join(f"{role} tp{m.tp} pp{m.pp} dp{m.dp} on {_short(m.ranks)}" for role, m in plan.meshes.items())
    return f"{plan.world_size} GPUs ({plan.nodes} node(s)): {roles}; rollout engine {plan.rollout_engine}"


def format_plan(plan: Plan) -> str:
    lines = [
        f"plan: {plan.world_size} GPUs = {plan.nodes} node(s) x {plan.gpus_per_node}",
        "",
        "role meshes:",
    ]
    for role, mesh in plan.meshes.items():
        tp = " ".join(f"[{_short(g)}]" for g in mesh.tp_groups()[:8])
        more = " ..." if len(mesh.tp_groups()) > 8 else ""
        lines.append(
            f"  {role:<8} gpus {_short(mesh.ranks):<12} tp={mesh.tp} pp={mesh.pp} dp={mesh.dp}  tp groups {tp}{more}"
        )
    lines.append("colocation sets: " + "  ".join(set_label(s) for s in plan.colocation_sets))
    lines.append("")
    # CPU "GPUs" hold a few MiB; real GPUs tens of GiB.
    unit_name, unit = ("GiB", GIB) if plan.capacity_bytes >= 16 * GIB else ("MiB", 2**20)
    header = ["gpu", "node", "roles", *_PARTS, "total", "usable", "use"]
    rows = []
    for gpu in plan.gpus:
        mem = plan.memory[gpu.rank]
        rows.append(
            [
                str(gpu.rank),
                str(gpu.node),
                ",".join(plan.rank_roles[gpu.rank]) or "-",
                *(f"{getattr(mem, p) / unit:.2f}" for p in _PARTS),
                f"{mem.total / unit:.2f}",
                f"{plan.usable_bytes / unit:.1f}",
                f"{100 * mem.total / plan.capacity_bytes:.0f}%" + (" OVER" if mem.total > plan.usable_bytes else ""),
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines.append(f"memory per GPU ({unit_name}):")
    for row in [header, *rows]:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i == 2 else c.rjust(w) for i, (c, w) in pairs]  # roles column left-aligned
        lines.append("  " + "  ".join(cells))
    lines.append(f"  usable = {plan.capacity_bytes / unit:.1f} capacity - {plan.headroom_bytes / unit:.1f} headroom "
                 "(cluster.gpu_memory_headroom_gib: CUDA contexts, NCCL buffers, fragmentation); use = of capacity")
    if plan.offload_fractions:
        shares = ", ".join(f"{role} {share:g}" for role, share in plan.offload_fractions.items())
        lines.append(f"  optimizer share offloaded to host memory: {shares}")
    if plan.update_max_tokens:
        budgets = ", ".join(f"{role} {tokens or 'micro_batch_size rows'}"
                            for role, tokens in plan.update_max_tokens.items())
        lines.append(f"  update micro-batch token budget (roles.<role>.update_max_tokens): {budgets}")
    lines.extend(_host_table(plan))
    return "\n".join(lines)


def _host_table(plan: Plan) -> list[str]:
    """One row per node: host memory by part (GiB), against cluster.host_memory_gib."""
    parts = tuple(f.name for f in fields(HostMemoryEstimate))
    header = ["node", *parts, "total", "capacity", "use"]
    rows = []
    for node, mem in plan.host_memory.items():
        cap = plan.host_capacity_bytes
        use = "-" if cap is None else f"{100 * mem.total / cap:.0f}%" + (" OVER" if mem.total > cap else "")
        rows.append([str(node), *(f"{getattr(mem, p) / GIB:.2f}" for p in parts), f"{mem.total / GIB:.2f}",
                     "-" if cap is None else f"{cap / GIB:.1f}", use])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["", "host memory per node (GiB; cluster.host_memory_gib):"]
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in [header, *rows]]
    return lines
