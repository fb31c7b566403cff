"""The auto planner on an `ExperimentConfig`: workload and memory estimator from the config, plan via
`build_plan` so an auto plan passes exactly the checks an explicit one does; and any plan priced as the search
prices its own candidates (`plan_candidate`, also for an explicit `placement.resources`).

Pricing uses the same workload, device figures, memory estimator and per-role stage times as the search, and the
same composition (`search.compose`): roles sharing GPUs run one after another (their times add), disjoint sets
run concurrently (a stage lasts as long as its slowest set), and at trainer.rollout_lag=1 (native engine)
generation on the rollout's own GPUs overlaps the rest. At lag 0 the rollout is costed on the actor's GPUs
at its own TP, as the search models it."""

from __future__ import annotations

import copy
from dataclasses import replace

from hybridflow.config.experiment import ExperimentConfig, engine_of, syncs_adapters, with_role_settings
from hybridflow.config.model import ModelConfig
from hybridflow.config.parallel import reference_is_actor_base
from hybridflow.errors import UserError
from hybridflow.placement.auto.cost_model import role_stage_breakdown
from hybridflow.placement.auto.device import DeviceSpec, Efficiency, efficiency_for
from hybridflow.placement.auto.explain import Explanation, explain
from hybridflow.placement.auto.search import Candidate, SearchResult, compose, search
from hybridflow.placement.auto.set_solver import MemoryFn, RoleChoice, SetSolution
from hybridflow.placement.auto.strategy import Strategy
from hybridflow.placement.auto.workload import ModelCostShape, RoleWork, Workload, split_rollout
from hybridflow.placement.checks import check_batch_sizes, sequence_parallel_width
from hybridflow.placement.memory import GIB, estimate_role_memory, offloaded_share, rollout_shares_actor_weights
from hybridflow.placement.mesh import ParallelDims
from hybridflow.placement.offload import roles_to_pick
from hybridflow.placement.planner import Plan, build_plan
from hybridflow.placement.report import set_memory_bytes
from hybridflow.placement.update_budget import budget_roles_to_pick
from hybridflow.role_records import Role, model_roles, role_record, trained_roles


def model_shape(model: ModelConfig, role: str) -> ModelCostShape:
    return ModelCostShape(hidden_size=model.hidden_size, intermediate_size=model.intermediate_size,
                      num_layers=model.num_hidden_layers, num_heads=model.num_attention_heads,
                      num_kv_heads=model.num_key_value_heads, vocab_size=model.vocab_size,
                      tie_embeddings=model.tie_word_embeddings, dtype_bytes=model.dtype_bytes,
                      head=role_record(role).head, head_dim=model.attention_head_dim)


def one_step_off(cfg: ExperimentConfig) -> bool:
    """trainer.rollout_lag=1 on an engine that supports it (its record's traits.supports_rollout_lag): the
    rollout is searched as a role on GPUs of its own.

    Another engine at lag 1 is planned as at lag 0, so build_plan's check_rollout_lag refuses it with its reason.
    """
    return bool(cfg.trainer.rollout_lag) and engine_of(cfg).traits.supports_rollout_lag


def workload_from_config(cfg: ExperimentConfig) -> Workload:
    """Roles taking part, batch and lengths from `cfg`. The rollout rides on the actor's set, or at
    trainer.rollout_lag=1 (native engine) is a role of its own that the search keeps off the actor's GPUs."""
    seq = cfg.data.seq_length
    roles = tuple(
        RoleWork(name, model_shape(cfg.role_model(name), name), role_record(name).stages,
                 cfg.roles.get(name).micro_batch_size,
                 cfg.roles.get(name).forward_micro_batch_size(seq), cfg.roles.get(name).update_micro_batch_size(seq),
                 offloaded_share(cfg.roles.get(name)) if role_record(name).trained else 0.0,
                 preparation_passes=_preparation_passes(cfg, name),
                 adapter_params=_adapter_params(cfg, name),
                 syncs_adapters=name == Role.ACTOR and syncs_adapters(cfg),
                 sequence_parallel_width=sequence_parallel_width(cfg, name))
        for name in model_roles() if cfg.roles.get(name).enabled and not _on_actor(cfg, name))
    lag = one_step_off(cfg)
    return Workload(roles=split_rollout(roles) if lag else roles, prompts=cfg.data.train_batch_size,
                    samples_per_prompt=cfg.rollout.n_samples_per_prompt,
                    prompt_length=cfg.data.max_prompt_length,
                    response_length=cfg.data.seq_length - cfg.data.max_prompt_length,
                    mini_batch_size=cfg.algorithm.mini_batch_size, ppo_epochs=cfg.algorithm.ppo_epochs,
                    rollout_offloads_weights=engine_of(cfg).weights_on_host_while_sleeping(cfg.rollout.sleep_level),
                    rollout_engine=cfg.rollout.engine, rollout_lag=int(lag))


def _preparation_passes(cfg: ExperimentConfig, role: str) -> float:
    """Forward passes `role` makes over the batch per step, on average: the actor's pi_old every step
    (algorithm.old_logprobs=actor) or, taken from the rollout, only on the parity gate's steps (trainer.parity_every,
    as RLStep.recomputes_old_logprobs runs them), plus the reference's when that is the actor's base."""
    if role != Role.ACTOR:
        return 1.0
    every = cfg.trainer.parity_every
    old = 1.0 if cfg.algorithm.old_logprobs == Role.ACTOR else (1.0 / every if every else 0.0)
    return old + (1.0 if _on_actor(cfg, Role.REF) else 0.0)


def _adapter_params(cfg: ExperimentConfig, role: str) -> int:
    """The LoRA adapter weights `role` trains (`roles.<role>.lora`), 0 when it trains fully or not at all."""
    lora = cfg.roles.get(role).lora
    return model_shape(cfg.role_model(role), role).lora_params(lora.rank, lora.target_modules) if lora.enabled else 0


def _on_actor(cfg: ExperimentConfig, role: str) -> bool:
    """A reference that is the actor with its adapters off is not searched: it goes where the actor goes, at its
    layout (`plan_from_candidate`; build_plan counts its forward pass's memory there), and its log-prob pass is
    costed as the actor's second preparation pass."""
    return role == Role.REF and reference_is_actor_base(cfg.roles)


def rollout_dims(s: Strategy) -> ParallelDims:
    return ParallelDims(tp=s.gen_tp, pp=1, dp=s.gen_dp)


def memory_from_config(cfg: ExperimentConfig) -> MemoryFn:
    """The foundation's `estimate_role_memory` as the search's memory callable (worst pipeline stage).

    The actor's figure adds the rollout colocated with it at (gen_tp, pp 1, gen_dp); a native rollout at
    the actor's exact layout shares its weights (`rollout_shares_actor_weights`), as `build_plan` counts it.
    A rollout on GPUs of its own (rollout_lag=1) counts only itself: no actor weights to share.
    """

    def memory(role: str, s: Strategy) -> tuple[float, float] | None:
        try:
            if role == Role.ROLLOUT:
                own = estimate_role_memory(cfg.model, Role.ROLLOUT, rollout_dims(s), cfg)
                return float(own.total), float(own.kv_cache)
            est = estimate_role_memory(cfg.role_model(role), role, ParallelDims(s.tp, s.pp, s.dp), cfg)
            if not s.gen_tp:
                return float(est.total), 0.0
            shares = rollout_shares_actor_weights(cfg, True, s.tp, s.pp, s.gen_tp)
            gen = estimate_role_memory(cfg.model, Role.ROLLOUT, rollout_dims(s), cfg,
                                       shares_actor_weights=shares)
        except UserError:
            return None  # e.g. a vLLM budget that cannot hold this shard: not a valid layout
        return float(est.total + gen.total), float(gen.kv_cache)

    return memory


def search_config(cfg: ExperimentConfig, eff: Efficiency | None = None) -> SearchResult:
    """Algorithm 1 over `cfg`'s roles and cluster (cost-model factors: `eff`, else the defaults with the
    figures measured on `cfg.cluster.gpu_type`)."""
    workload = workload_from_config(cfg)
    # A micro-batch that splits no batch even at DP 1 rules out every layout: a config error (the explicit
    # planner's own check, at DP 1), not "nothing fits".
    for role in workload.roles:
        check_batch_sizes(cfg, role.name, ParallelDims(tp=1, pp=1, dp=1))
    device = DeviceSpec.from_cluster(cfg.cluster)
    eff = eff or efficiency_for(cfg.cluster.gpu_type)
    # The estimator leaves out CUDA contexts, NCCL buffers and fragmentation: the search fills GPUs only up to
    # what build_plan's check accepts, the capacity less cluster.gpu_memory_headroom_gib.
    capacity = (cfg.cluster.gpu_memory_gib - cfg.cluster.gpu_memory_headroom_gib) * GIB
    result = search(workload, device, memory_from_config(cfg), eff, capacity,
                    tuple(tuple(g) for g in cfg.placement.colocate))
    if not (roles_to_pick(cfg, workload.role_names) or budget_roles_to_pick(cfg, workload.role_names)):
        return result
    # An unset offload_fraction is searched at 1.0 (offloaded_share: the memory the search may count on) and an
    # unset update_max_tokens at micro_batch_size rows (the least activation memory), but build_plan then picks
    # one plan-wide share (0.95 for ppo_llama3_8b_4gpu) and token budget from the chosen layouts' memory: the
    # chosen candidate is priced at the share and micro-batches its plan runs, as plan_candidate prices any plan.
    chosen = plan_candidate(cfg, plan_from_candidate(cfg, result.chosen), eff=eff)
    for p in result.partitions:
        if p.best is result.chosen:
            p.best = chosen
    result.chosen = chosen
    return result


def plan_from_candidate(cfg: ExperimentConfig, cand: Candidate) -> Plan:
    """Role -> ranks and layouts of `cand`, checked and assembled by `build_plan`."""
    ranks: dict[str, tuple[int, ...]] = {}
    dims: dict[str, ParallelDims] = {}
    for set_solution, rank_range in zip(cand.sets, cand.ranks, strict=True):
        for choice in set_solution.choices:
            s = choice.strategy
            ranks[choice.role] = tuple(rank_range)
            dims[choice.role] = ParallelDims(s.tp, s.pp, s.dp)  # a rollout of its own: its generation layout
            if s.gen_tp and choice.role != Role.ROLLOUT:  # the actor's colocated rollout
                ranks[Role.ROLLOUT] = tuple(rank_range)
                dims[Role.ROLLOUT] = rollout_dims(s)
    if _on_actor(cfg, Role.REF) and Role.ACTOR in ranks:
        ranks[Role.REF], dims[Role.REF] = ranks[Role.ACTOR], dims[Role.ACTOR]
    return build_plan(cfg, ranks, dims)


def search_placement(cfg: ExperimentConfig, eff: Efficiency | None = None) -> tuple[Plan, Explanation]:
    """The chosen plan for `placement.mode=auto` and the explanation of the choice."""
    result = search_config(cfg, eff)
    plan = plan_from_candidate(cfg, result.chosen)
    explanation = explain(result)
    # Memory as the plan's per-GPU table reports it (the search's own figure leaves out what build_plan adds
    # per rank), so the explanation and the table print one number.
    explanation.memory_gib = {name: b / GIB for name, b in set_memory_bytes(plan).items()}
    return plan, explanation


def config_with_plan(cfg: ExperimentConfig, plan: Plan) -> ExperimentConfig:
    """A copy of `cfg` whose `roles.<role>.parallel` (tp, pp, dp) are the plan's layouts.

    In auto mode the layouts in the config are not used for planning; code that reads them after planning
    (workers, the rollout engine) should see what the plan chose.
    """
    out = copy.deepcopy(cfg)
    for role, mesh in plan.meshes.items():
        par = out.roles.get(role).parallel
        par.tp, par.dp = mesh.tp, mesh.dp
        if role != Role.ROLLOUT:  # the rollout's pp is always 1 (RolloutParallelConfig)
            par.pp = mesh.pp
    return out


def plan_auto(cfg: ExperimentConfig) -> Plan:
    """What `plan_placement` calls for `placement.mode=auto`."""
    return search_placement(cfg)[0]


def workload_at_lengths(cfg: ExperimentConfig, lengths: tuple[float, float] | None = None) -> Workload:
    """The config's workload, at (prompt, response) tokens per sample when given (rounded, at least 1)."""
    workload = workload_from_config(cfg)
    if lengths is None:
        return workload
    prompt, response = (max(1, round(n)) for n in lengths)
    return replace(workload, prompt_length=prompt, response_length=response)


def config_at_plan_picks(cfg: ExperimentConfig, plan: Plan) -> ExperimentConfig:
    """A copy of `cfg` whose trained roles carry the optimizer share and update token budget `plan` runs with
    (what build_plan picked for an unset roles.<role>.offload_fraction / update_max_tokens)."""
    return with_role_settings(cfg, {
        role: {"offload_fraction": plan.offload_fractions.get(role, cfg.roles.get(role).offload_fraction),
               "update_max_tokens": plan.update_max_tokens.get(role, cfg.roles.get(role).update_max_tokens)}
        for role in trained_roles() if role in plan.meshes})


def plan_candidate(cfg: ExperimentConfig, plan: Plan, lengths: tuple[float, float] | None = None,
                   eff: Efficiency | None = None) -> Candidate:
    """`plan` priced as the search prices its own candidates; `candidate.total` is the predicted step.

    `lengths` = (prompt, response) tokens per sample, e.g. a run's measured means; default: the config's
    longest prompt and full response length. `eff`: the cost-model factors (default: those measured on
    `cfg.cluster.gpu_type`, as the search uses).
    """
    cfg = config_at_plan_picks(cfg, plan)
    workload = workload_at_lengths(cfg, lengths)
    device = DeviceSpec.from_cluster(cfg.cluster)
    eff = eff or efficiency_for(cfg.cluster.gpu_type)
    memory = memory_from_config(cfg)
    rollout = plan.meshes.get(Role.ROLLOUT)
    sets, ranks = [], []
    for roles in plan.colocation_sets:
        choices = []
        for name in roles:
            if name not in workload.role_names:
                continue  # a rollout riding on the actor: costed with it (its generation stage)
            mesh, role = plan.meshes[name], workload.role(name)
            s = Strategy(mesh.tp, mesh.pp, mesh.dp, rollout.tp if role.generates and rollout else 0)
            estimate = memory(name, s)  # None: a layout the search would skip; no figures then
            bytes_, kv = estimate if estimate else (0.0, 0.0)
            parts = role_stage_breakdown(role, s, workload, device, eff, kv)
            times = {stage: sum(p.values()) for stage, p in parts.items()}
            choices.append(RoleChoice(name, s, bytes_, times, parts))  # with parts, as the search's choices
        if choices:
            held = sorted({r for name in roles for r in plan.meshes[name].ranks})
            sets.append(SetSolution(tuple(c.role for c in choices), len(held), tuple(choices)))
            ranks.append(tuple(held))
    return compose(tuple(sets), tuple(ranks), workload, device, eff)

