"""Parallel strategies one role may take on a set of GPUs: (TP inside an NVLink domain, PP, DP[, TP_gen])."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.placement.auto.device import DeviceSpec
from hybridflow.placement.auto.workload import RoleWork, Workload
from hybridflow.placement.mesh import ParallelDims

# Deeper pipelines than this do not win at RLHF batch sizes (the bubble grows with pp); they only slow the
# search.
MAX_PP = 16


@dataclass(frozen=True, order=True)
class Strategy(ParallelDims):
    """A role's mesh on `tp * pp * dp` GPUs (ParallelDims: checked there); `gen_tp` is the rollout's TP (a
    generating role only, else 0). Ordered by (tp, pp, dp, gen_tp).

    Generation runs without pipeline (p_g = 1) on the same GPUs, dp_g = GPUs / gen_tp. A rollout on GPUs of
    its own (`RoleWork.generates_only`) has only its generation layout: tp = gen_tp, pp = 1.
    """

    gen_tp: int = 0

    @property
    def gpus(self) -> int:
        return self.size

    @property
    def gen_dp(self) -> int:
        return self.gpus // self.gen_tp if self.gen_tp else 0

    def label(self) -> str:
        text = f"tp{self.tp} pp{self.pp} dp{self.dp}"
        return text + (f" | gen tp{self.gen_tp} dp{self.gen_dp}" if self.gen_tp else "")


def _powers_of_two_upto(limit: int) -> list[int]:
    out, value = [], 1
    while value <= limit:
        out.append(value)
        value *= 2
    return out


def _tp_ok(tp: int, role: RoleWork) -> bool:
    """Megatron needs whole heads, query groups and MLP columns per TP rank, and sequence parallelism whole
    sequence shards (placement.checks.check_layout_fits_model refuses the rest; the TPs here, powers of two up
    to a node, divide the 64-column trim)."""
    m, width = role.model, role.sequence_parallel_width
    return not (m.num_heads % tp or m.num_kv_heads % tp or m.intermediate_size % tp or (width and width % tp))


def strategies_for(role: RoleWork, gpus: int, device: DeviceSpec, workload: Workload) -> list[Strategy]:
    """Every strategy `role` may run with on `gpus` GPUs, in a fixed order (the search is deterministic).

    TP is a power of two that fits one NVLink domain and divides the heads; PP divides the layers; DP
    divides the role's batch (a trained role's optimizer step, otherwise all samples) so every rank gets
    whole micro-batches. The actor adds every rollout TP that divides its training TP: the bridge's
    zero-redundancy grouping takes generation TP groups at stride t / t_g inside each training TP group.
    A generation-only rollout (rollout_lag=1) takes only generation layouts.
    """
    if role.generates_only:
        return _rollout_strategies(role, gpus, device, workload)
    out: list[Strategy] = []
    batch = workload.mini_batch_size if role.trains else workload.samples
    for tp in _powers_of_two_upto(min(device.nvlink_domain, gpus)):
        if gpus % tp or not _tp_ok(tp, role):
            continue
        for pp in range(1, min(MAX_PP, role.model.num_layers) + 1):
            if (gpus // tp) % pp or role.model.num_layers % pp:
                continue
            dp = gpus // (tp * pp)
            if batch % (dp * role.micro_batch_size):
                continue
            if not role.generates:
                out.append(Strategy(tp, pp, dp))
                continue
            for gen_tp in _powers_of_two_upto(tp):
                if workload.prompts % (gpus // gen_tp):  # the rollout splits prompts over its DP
                    continue
                out.append(Strategy(tp, pp, dp, gen_tp))
    return out


def no_strategy_reason(role: RoleWork, gpus: int, device: DeviceSpec, workload: Workload) -> str:
    """Why `strategies_for` is empty: the constraint that rules out every layout, with its numbers."""
    if role.generates_only:
        return (f"no TP (a power of two <= {min(device.nvlink_domain, gpus)} dividing the heads) "
                f"leaves {gpus} GPUs / tp ranks that split the {workload.prompts} prompts evenly")
    tps = [tp for tp in _powers_of_two_upto(min(device.nvlink_domain, gpus)) if gpus % tp == 0 and _tp_ok(tp, role)]
    pps = [pp for pp in range(1, min(MAX_PP, role.model.num_layers) + 1) if role.model.num_layers % pp == 0]
    dps = sorted({gpus // (tp * pp) for tp in tps for pp in pps if (gpus // tp) % pp == 0})
    shape = (f"tp a power of two <= {min(device.nvlink_domain, gpus)} dividing {role.model.num_heads} heads and "
             f"{role.model.num_kv_heads} query groups, pp dividing {role.model.num_layers} layers")
    if not dps:
        return f"no tp x pp ({shape}) divides {gpus} GPUs"
    batch, what = ((workload.mini_batch_size, "mini-batch") if role.trains
                   else (workload.samples, "batch"))
    fits = [dp for dp in dps if batch % (dp * role.micro_batch_size) == 0]
    if not fits:
        return (f"dp = {gpus} GPUs / (tp x pp) can be {', '.join(map(str, dps))} ({shape}), and "
                f"none divides its {what} of {batch} samples into whole micro-batches of {role.micro_batch_size}")
    return (f"no rollout TP splits the {workload.prompts} prompts evenly over {gpus} GPUs / gen_tp "
            "ranks")


def _rollout_strategies(role: RoleWork, gpus: int, device: DeviceSpec, workload: Workload) -> list[Strategy]:
    """A rollout alone on `gpus` GPUs: every TP inside one NVLink domain whose DP splits the prompts."""
    return [Strategy(g, 1, gpus // g, g) for g in _powers_of_two_upto(min(device.nvlink_domain, gpus))
            if gpus % g == 0 and _tp_ok(g, role) and workload.prompts % (gpus // g) == 0]
