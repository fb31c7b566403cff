"""Turn (config, plan) into this rank's roles, engine, bridge and trainer. Collective over the world.

Order matters: process groups are created collectively, so every rank builds every role's groups in the
same order (actor, critic, ref, reward, rollout) even for roles it does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from hybridflow.algorithms import build_algorithm, build_kl_controller
from hybridflow.config import ExperimentConfig
from hybridflow.config.experiment import lr_decay_steps, syncs_adapters, with_engine
from hybridflow.config.model import torch_dtype
from hybridflow.config.parallel import reference_is_actor_base
from hybridflow.data import PromptDataset, load_prompt_dataset, load_tokenizer
from hybridflow.data.vocabulary import stop_token_ids
from hybridflow.placement import Plan
from hybridflow.role_records import Role, model_roles, role_record
from hybridflow.roles.groups import build_groups, build_training_group
from hybridflow.roles.model_role import (
    ModelRole,
    OptimizerSettings,
    absent_from_role,
    actor_base_role,
    build_model_role,
    lora_settings,
    model_spec,
    role_config_overrides,
)
from hybridflow.roles.rollout_role import build_rollout_role, start_rollout
from hybridflow.rollout.base import EngineSetup, SamplingParams
from hybridflow.rollout.turns import TurnSettings
from hybridflow.tools import environment_tools, get_environment
from hybridflow.trainer.device_memory import BuildMemory
from hybridflow.trainer.model_files import ensure_model_files, role_model_dirs
from hybridflow.trainer.rl_trainer import RLTrainer
from hybridflow.trainer.scorer import build_scorer
from megatron_adapters.bridge import build_reshard_plan
from megatron_adapters.cpu_backend import compute_device


def optimizer_settings(cfg: ExperimentConfig, role: str, offload_share: float) -> OptimizerSettings:
    """A trained role's optimizer knobs from `trainer.*` (lr, its schedule, clipping) and the planner's
    offload share (0 = no offload)."""
    tr = cfg.trainer
    lr = tr.critic_lr or tr.lr if role == Role.CRITIC else tr.lr
    return OptimizerSettings(lr=lr, weight_decay=tr.weight_decay, grad_clip=tr.grad_clip,
                             lr_warmup_steps=tr.lr_warmup_steps, lr_decay_style=tr.lr_decay_style,
                             lr_decay_steps=lr_decay_steps(cfg), min_lr=tr.min_lr,
                             offload_optimizer=offload_share > 0, offload_fraction=offload_share or 1.0)


@dataclass
class BuiltRun:
    trainer: RLTrainer
    tokenizer: PreTrainedTokenizerBase
    dataset: PromptDataset
    hf_dir: str
    work_dir: Path
    memory: BuildMemory  # device memory after each build stage (empty without CUDA)


def rollout_sampling(cfg: ExperimentConfig, tokenizer: PreTrainedTokenizerBase) -> SamplingParams:
    """What both engines sample with; the stop ids are the ones the plan printed (`stop_token_ids`)."""
    return SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
        top_k=max(cfg.rollout.top_k, 0), stop_token_ids=stop_token_ids(cfg, tokenizer),
        pad_token_id=tokenizer.pad_token_id, seed=cfg.trainer.seed,
    )


def turn_settings(cfg: ExperimentConfig, tokenizer: PreTrainedTokenizerBase) -> TurnSettings | None:
    """The turn loop of `rollout.environment` (None: single turn); prompts are rendered with the same tools."""
    if cfg.rollout.environment is None:
        return None
    return TurnSettings(environment=get_environment(cfg.rollout.environment), tokenizer=tokenizer,
                        prompt_key=cfg.data.prompt_key,
                        max_turns=cfg.rollout.max_turns, max_new_tokens=cfg.rollout.max_new_tokens,
                        max_tool_tokens=cfg.rollout.max_tool_tokens, budget=cfg.data.seq_length,
                        tools=environment_tools(cfg.rollout.environment))


def build_run(cfg: ExperimentConfig, plan: Plan, work_dir: Path) -> BuiltRun:
    """Everything this rank needs for the run; every rank calls it."""
    device = compute_device()
    memory = BuildMemory()
    memory.mark("context")  # the default group is up: this process's CUDA context and its first communicator
    hf_dir, tok_dir = ensure_model_files(cfg, work_dir)
    # Critic and reward model load their own checkpoints (own shape, same vocabulary: checked in config).
    model_dirs = role_model_dirs(cfg, work_dir, hf_dir)
    tokenizer = load_tokenizer(tok_dir)
    # The plan holds the rollout in generation order; the bridge's reshard plan (who sends which shards to
    # whom) comes from its two meshes. Then every role's groups are built, collectively.
    meshes = plan.meshes
    reshard_plan = build_reshard_plan(meshes[Role.ACTOR], meshes[Role.ROLLOUT])
    groups = build_groups(meshes)
    training = build_training_group(meshes)
    memory.mark("groups")
    setup = EngineSetup(rollout=cfg.rollout, mesh=meshes[Role.ROLLOUT], groups=groups[Role.ROLLOUT], hf_dir=hf_dir,
                        dtype=torch_dtype(cfg.rollout.dtype or cfg.model.dtype), device=device,
                        seed=cfg.trainer.seed, timeout_s=cfg.distributed.timeout_s,
                        lora=lora_settings(cfg.roles.actor.lora)
                        if syncs_adapters(with_engine(cfg, plan.rollout_engine)) else None)
    started = start_rollout(plan.rollout_engine, setup)  # an engine process imports while the models build

    roles: dict[str, ModelRole] = {}
    for role in model_roles():
        record = role_record(role)
        trained = record.trained
        if role not in meshes:
            continue
        if groups[role] is None:
            absent_from_role(trained)
            continue
        role_cfg = cfg.roles.get(role)
        if role == Role.REF and reference_is_actor_base(cfg.roles):  # on the actor's ranks: no model of its own
            roles[role] = actor_base_role(roles[record.weights_from], role, role_cfg.micro_batch_size,
                                          role_cfg.max_tokens_per_micro_batch or 0,
                                          role_cfg.forward_micro_batch_size(cfg.data.seq_length))
            continue
        # the planner resolved an unset offload_fraction
        settings = optimizer_settings(cfg, role, plan.offload_fractions.get(role, 0.0))
        tp = meshes[role].tp
        lora = lora_settings(role_cfg.lora)
        dtype = torch_dtype(cfg.role_model(role).dtype)
        overrides = role_config_overrides(trained, tp, role_cfg.activation_recompute,
                                          bool(role_cfg.parallel.sequence_parallel), model_spec(lora),
                                          dtype if role_cfg.max_tokens_per_micro_batch else None)
        roles[role] = build_model_role(
            role, meshes[role], groups[role], model_dirs[role], record.head, dtype,
            role_cfg.micro_batch_size,
            optimizer=settings if trained else None, seed=cfg.trainer.seed,
            max_tokens_per_micro_batch=role_cfg.max_tokens_per_micro_batch or 0,
            forward_micro_batch_size=role_cfg.forward_micro_batch_size(cfg.data.seq_length),
            update_micro_batch_size=role_cfg.update_micro_batch_size(cfg.data.seq_length,
                                                                     plan.update_max_tokens.get(role, 0)),
            lora=lora, **overrides,
        )
        memory.mark(role)

    for built_role in roles.values():
        built_role.compile_logprobs = cfg.trainer.compile_logprobs
    sampling = rollout_sampling(cfg, tokenizer)
    rollout = build_rollout_role(plan.rollout_engine, setup, reshard_plan, sampling, started,  # the plan's engine
                                 turns=turn_settings(cfg, tokenizer), adapter_dir=work_dir / "rollout_adapter")
    memory.mark(Role.ROLLOUT)
    rollout.sync(roles.get(Role.ACTOR))  # the engine starts from the actor's weights, through the bridge
    memory.mark("synced")
    alg = cfg.algorithm
    trainer = RLTrainer(
        cfg=cfg, roles=roles, meshes=meshes, rollout=rollout,
        scorer=build_scorer(cfg, tokenizer, roles.get(Role.REWARD), meshes.get(Role.REWARD), device),
        kl_ctl=build_kl_controller(alg.kl_controller, alg.kl_coef, alg.kl_target, alg.kl_horizon),
        algorithm=build_algorithm(cfg),
        device=device, training=training,
    )
    dataset = load_prompt_dataset(cfg.data.source, cfg.data.prompt_key, seed=cfg.trainer.seed)
    return BuiltRun(trainer, tokenizer, dataset, hf_dir, work_dir, memory)
