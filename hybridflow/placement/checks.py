"""Checks of a role layout against the model, the cluster and the batch sizes (each names the fix)."""

from __future__ import annotations

from collections.abc import Sequence

from hybridflow.config.data import TRIM_MULTIPLE
from hybridflow.config.experiment import ExperimentConfig, engine_of
from hybridflow.config.parallel import reference_is_actor_base
from hybridflow.engines import engine_names, get_engine
from hybridflow.errors import UserError
from hybridflow.placement.cluster import GPU, nvlink_domain
from hybridflow.placement.memory import sequence_parallel
from hybridflow.placement.mesh import ParallelDims, RoleMesh
from hybridflow.role_records import Role, role_names, role_record


def check_layout_fits_model(cfg: ExperimentConfig, role: str, dims: ParallelDims) -> None:
    """TP divides heads, query groups and the MLP width, PP divides layers, TP fits in one node / NVLink domain."""
    model, mfield, field = cfg.role_model(role), cfg.role_model_field(role), f"roles.{role}.parallel"
    tp, pp = dims.tp, dims.pp
    if tp > cfg.cluster.gpus_per_node:
        raise UserError(
            f"{field}.tp: {tp} exceeds cluster.gpus_per_node={cfg.cluster.gpus_per_node}; TP stays inside "
            f"one node: use tp <= {cfg.cluster.gpus_per_node} and raise pp or dp"
        )
    if tp > cfg.cluster.nvlink_domain_size:
        raise UserError(
            f"{field}.tp: {tp} exceeds cluster.nvlink_domain_size={cfg.cluster.nvlink_domain_size}; "
            f"use tp <= {cfg.cluster.nvlink_domain_size}"
        )
    heads, groups = model.num_attention_heads, model.num_key_value_heads
    if heads % tp:
        raise UserError(f"{field}.tp: {tp} does not divide {mfield}.num_attention_heads={heads}; use a divisor")
    # An engine that replicates KV heads (vLLM) takes a TP above them; megatron needs whole query groups per rank.
    replicated_kv_ok = role == Role.ROLLOUT and engine_of(cfg).traits.replicates_kv_heads and tp % groups == 0
    if groups % tp and not replicated_kv_ok:
        raise UserError(
            f"{field}.tp: {tp} does not divide {mfield}.num_key_value_heads={groups} (query groups); "
            f"use a divisor of {groups}"
        )
    if model.intermediate_size % tp:  # megatron's and vLLM's MLP split it over TP (a rank asserted it at build)
        raise UserError(f"{field}.tp: {tp} does not divide {mfield}.intermediate_size={model.intermediate_size}; "
                        f"use a divisor of {model.intermediate_size}")
    check_sequence_parallel_widths(cfg, role, tp)
    layers = model.num_hidden_layers
    if pp > layers:
        raise UserError(f"{field}.pp: {pp} exceeds {mfield}.num_hidden_layers={layers}; use pp <= {layers}")
    if layers % pp:
        raise UserError(
            f"{field}.pp: {pp} does not divide {mfield}.num_hidden_layers={layers}; use a divisor of {layers}"
        )


def sequence_parallel_width(cfg: ExperimentConfig, role: str) -> int:
    """data.seq_length where `role` would split sequences over TP (sequence parallelism asked for, on a GPU
    cluster: it stays off on the CPU backend), which its TP must then divide; 0 where it would not. Batches are
    trimmed to TRIM_MULTIPLE-column multiples up to it, so TP must divide TRIM_MULTIPLE too."""
    if role == Role.ROLLOUT or cfg.cluster.gpu_type == "cpu" or not sequence_parallel(cfg, role, 2):
        return 0
    return cfg.data.seq_length


def check_sequence_parallel_widths(cfg: ExperimentConfig, role: str, tp: int) -> None:
    """Every width a sequence-parallel role sees divides by its TP (the rank refused it at build otherwise, with
    Transformer Engine, which turns sequence parallelism on)."""
    width = sequence_parallel_width(cfg, role)
    if tp > 1 and width and (width % tp or TRIM_MULTIPLE % tp):
        field = f"roles.{role}.parallel"
        raise UserError(
            f"data.seq_length: {width} is not a multiple of {field}.tp={tp} (sequence parallelism needs every "
            f"width, {TRIM_MULTIPLE}-multiples up to data.seq_length, divisible by tp); set data.seq_length to a "
            f"multiple of a tp that divides {TRIM_MULTIPLE}, or {field}.sequence_parallel=false"
        )


def check_tp_groups_local(mesh: RoleMesh, gpus: Sequence[GPU], cfg: ExperimentConfig) -> None:
    """Every TP group lies inside one node's NVLink domain (TP all-reduces every layer)."""
    for group in mesh.tp_groups():
        domains = {nvlink_domain(gpus[r], cfg.cluster) for r in group}
        if len(domains) > 1:
            nodes = sorted({gpus[r].node for r in group})
            where = f"nodes {nodes}" if len(nodes) > 1 else f"NVLink domains of node {nodes[0]}"
            raise UserError(
                f"placement.resources.{mesh.role}: TP group {list(group)} spans {where}; order the GPU list "
                f"so each run of tp={mesh.tp} consecutive GPUs lies in one node"
            )


def check_batch_sizes(cfg: ExperimentConfig, role: str, dims: ParallelDims) -> None:
    """Batches split evenly over DP and micro-batches."""
    samples = cfg.data.train_batch_size * cfg.rollout.n_samples_per_prompt
    if role == Role.ROLLOUT:
        if cfg.data.train_batch_size % dims.dp:
            raise UserError(
                f"data.train_batch_size: {cfg.data.train_batch_size} prompts do not split over the rollout's "
                f"dp={dims.dp}; use a multiple of {dims.dp}"
            )
        return
    mbs = cfg.roles.get(role).micro_batch_size
    unit = dims.dp * mbs
    if role_record(role).trained:
        if cfg.algorithm.mini_batch_size % unit:
            raise UserError(
                f"algorithm.mini_batch_size: {cfg.algorithm.mini_batch_size} is not divisible by {role} dp x "
                f"micro_batch_size = {dims.dp} x {mbs} = {unit}; use a multiple of {unit} or change "
                f"roles.{role}.micro_batch_size"
            )
    elif samples % unit:
        raise UserError(
            f"roles.{role}.micro_batch_size: {samples} samples per step are not divisible by dp x "
            f"micro_batch_size = {dims.dp} x {mbs} = {unit}; "
            f"pick a micro_batch_size dividing {samples // dims.dp}"
        )


def check_colocation(cfg: ExperimentConfig, role_ranks: dict[str, tuple[int, ...]]) -> None:
    """A rollout sharing GPUs with the actor takes its exact GPU list; `placement.colocate` groups match."""
    actor, rollout = role_ranks.get(Role.ACTOR), role_ranks.get(Role.ROLLOUT)
    if actor and rollout and set(actor) & set(rollout) and set(actor) != set(rollout):
        raise UserError(
            f"placement.resources.rollout: {list(rollout)} overlaps the actor's {list(actor)} without being "
            "the same list; a colocated rollout takes the actor's exact GPUs (weights handed over in place): "
            "use the actor's list or disjoint GPUs"
        )
    for i, group in enumerate(cfg.placement.colocate):
        present = [r for r in group if r in role_ranks]
        for role in group:
            if role not in cfg.roles.__dataclass_fields__:
                raise UserError(
                    f"placement.colocate[{i}]: unknown role {role!r}; use {', '.join(role_names())}"
                )
        for role in present[1:]:
            if set(role_ranks[role]) != set(role_ranks[present[0]]):
                raise UserError(
                    f"placement.resources.{role}: {list(role_ranks[role])} differs from {present[0]}'s "
                    f"{list(role_ranks[present[0]])} but placement.colocate[{i}] declares them colocated; "
                    "give them the same GPU list"
                )


def check_rollout_lag(cfg: ExperimentConfig, meshes: dict[str, RoleMesh]) -> None:
    """`trainer.rollout_lag=1` generates the next batch while the actor trains: the rollout needs its own GPUs."""
    if not cfg.trainer.rollout_lag or Role.ROLLOUT not in meshes or Role.ACTOR not in meshes:
        return
    engine = engine_of(cfg)
    if not engine.traits.supports_rollout_lag:
        own_gpus = ("(placement=auto then plans its own GPUs)" if cfg.placement.mode == "auto"
                    else "with placement.resources.rollout on GPUs the actor does not hold")
        lagging = [name for name in engine_names() if get_engine(name).traits.supports_rollout_lag]
        raise UserError(
            f"trainer.rollout_lag: 1 with rollout.engine={engine.name} has never run (it needs a rollout on GPUs "
            "of its own, and no multi-GPU machine was available to verify it); set trainer.rollout_lag=0, or "
            f"rollout.engine={' or '.join(lagging)} {own_gpus}"
        )
    shared = sorted(set(meshes[Role.ACTOR].ranks) & set(meshes[Role.ROLLOUT].ranks))
    if shared:
        raise UserError(
            f"trainer.rollout_lag: 1 generates batch k+1 while the actor trains on batch k, but the rollout shares "
            f"the actor's GPUs {shared}; set placement.resources.rollout to GPUs the actor does not hold "
            "(e.g. placement=split_rollout on 4 GPUs) or trainer.rollout_lag=0"
        )


def check_rollout_engine(cfg: ExperimentConfig) -> None:
    """The engine can run on this cluster: a GPU-only engine (its record's traits.gpu_only: vLLM) is refused on
    a cpu cluster, as the run refuses it on a machine without CUDA."""
    engine = engine_of(cfg)
    if engine.traits.gpu_only and cfg.cluster.gpu_type == "cpu":
        others = [n for n in engine_names() if not get_engine(n).traits.gpu_only]
        raise UserError(
            f"rollout.engine: {engine.name} runs on CUDA GPUs only and cluster.gpu_type is cpu; set "
            f"rollout.engine={' or '.join(others)} (or auto), or pick a GPU cluster (cluster=...)"
        )


def can_offload_optimizer(cfg: ExperimentConfig, role: str) -> bool:
    """megatron's CPU offload of the optimizer (HybridDeviceOptimizer, megatron_adapters.optimizer) takes bf16
    params only; a CPU run keeps its optimizer in host memory anyway."""
    return cfg.cluster.gpu_type == "cpu" or cfg.role_model(role).dtype == "bf16"


def check_optimizer_offload(cfg: ExperimentConfig) -> None:
    """No trained role offloads its optimizer over params megatron cannot offload, as the rank would refuse."""
    for role in (r for r in role_names() if role_record(r).trained and cfg.roles.get(r).offload_optimizer):
        if not can_offload_optimizer(cfg, role):
            field = cfg.role_model_field(role)
            raise UserError(
                f"roles.{role}.offload_optimizer: megatron offloads the optimizer of bf16 params only and "
                f"{field}.dtype is {cfg.role_model(role).dtype}; set {field}.dtype=bf16 or "
                f"roles.{role}.offload_optimizer=false"
            )


def memory_fixes(cfg: ExperimentConfig, roles: Sequence[str], offload_fractions: dict[str, float],
                 update_max_tokens: dict[str, int]) -> list[str]:
    """What could bring a GPU holding `roles` under its capacity, naming each role's field and leaving out what
    the config already does (an optimizer offloaded in full, micro-batches of one row, the smallest update
    budget). `cfg` is the resolved config; the two dicts are the plan's picks (role -> share, role -> tokens)."""
    one_gpu = cfg.cluster.nodes * cfg.cluster.gpus_per_node == 1
    fixes = ["use more GPUs (cluster.gpus_per_node) and raise tp/pp or spread roles over them" if one_gpu
             else "raise tp/pp or spread roles over more GPUs"]
    for role in (r for r in roles if role_record(r).trained):
        settings = cfg.roles.get(role)
        if not settings.offload_optimizer and can_offload_optimizer(cfg, role):
            fixes.append(f"set roles.{role}.offload_optimizer=true")
        elif offload_fractions.get(role, 1.0) < 1.0:
            fixes.append(f"raise roles.{role}.offload_fraction (now {offload_fractions[role]:g}) toward 1")
        if update_max_tokens.get(role, 0) > 0:
            fixes.append(f"lower roles.{role}.update_max_tokens (now {update_max_tokens[role]})")
    for role in (r for r in roles if r != Role.ROLLOUT):
        mbs = cfg.roles.get(role).micro_batch_size
        if mbs is not None and mbs > 1:
            fixes.append(f"lower roles.{role}.micro_batch_size (now {mbs})")
    if Role.ROLLOUT in roles and _kv_cache_follows_utilization(cfg):
        fixes.append(f"lower rollout.gpu_memory_utilization (now {cfg.rollout.gpu_memory_utilization:g})")
    elif Role.ROLLOUT in roles:  # the cache holds the whole batch at full length
        fixes.append(f"lower data.train_batch_size (the rollout caches {cfg.data.train_batch_size} x "
                     f"{cfg.rollout.n_samples_per_prompt} sequences of {cfg.data.seq_length} tokens at once)")
    return fixes


def _kv_cache_follows_utilization(cfg: ExperimentConfig) -> bool:
    """Whether the rollout engine's KV cache shrinks with rollout.gpu_memory_utilization (asked of its record:
    vLLM fills that share of the GPU; the native engine sizes its cache for the batch)."""
    engine, util, gib = engine_of(cfg), cfg.rollout.gpu_memory_utilization, cfg.cluster.gpu_memory_gib
    return engine.kv_cache_bytes(util / 2, gib, 0, 0) < engine.kv_cache_bytes(util, gib, 0, 0)


def check_reference_on_actor(cfg: ExperimentConfig, meshes: dict[str, RoleMesh]) -> None:
    """A reference that is the actor with its adapters off (`reference_is_actor_base`) runs on the actor's model,
    so its mesh must be the actor's: same GPUs in the same order, same degrees."""
    ref, actor = meshes.get(Role.REF), meshes.get(Role.ACTOR)
    if not reference_is_actor_base(cfg.roles) or ref is None or actor is None:
        return
    if (ref.ranks, ref.tp, ref.pp, ref.dp) != (actor.ranks, actor.tp, actor.pp, actor.dp):
        raise UserError(
            f"placement.resources.ref: the reference runs on GPUs {list(ref.ranks)} at tp={ref.tp} pp={ref.pp} "
            f"dp={ref.dp}, but with roles.actor.lora it is the actor's model with its adapters off (GPUs "
            f"{list(actor.ranks)}, tp={actor.tp} pp={actor.pp} dp={actor.dp}); leave placement.resources.ref "
            "unset (the actor's GPUs)"
        )
