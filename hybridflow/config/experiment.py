"""The whole experiment: one typed tree composed from conf/ by Hydra."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hybridflow.config.algorithm import AlgorithmConfig
from hybridflow.config.bounds import check_bounds
from hybridflow.config.cluster import ClusterConfig, resolve_cluster
from hybridflow.config.data import DataConfig, RewardConfig
from hybridflow.config.model import (
    CheckpointResolver,
    ModelConfig,
    apply_hf_checkpoint,
    check_same_vocab,
    validate_model,
)
from hybridflow.config.parallel import RolesConfig, reference_is_actor_base
from hybridflow.config.placement import PlacementConfig
from hybridflow.config.rollout import RolloutConfig
from hybridflow.config.trainer import DistributedConfig, TrainerConfig
from hybridflow.engines import AUTO, EngineRecord, get_engine
from hybridflow.engines.vllm_args import check_engine_args
from hybridflow.errors import UserError
from hybridflow.role_records import Role, model_roles, own_model_fields, role_record, trained_roles
from hybridflow.tools import get_environment


@dataclass
class ExperimentConfig:
    name: str = "default"
    imports: list[str] = field(default_factory=list)  # the user's modules, imported first (config/load.py)
    # Folders those modules (and reward.fn's) import from, put on sys.path first in every process, the ranks
    # that read plan.json under srun too: an experiment file's own folder is added when it is loaded.
    import_dirs: list[str] = field(default_factory=list)
    model: ModelConfig = field(default_factory=ModelConfig)
    critic_model: ModelConfig | None = None  # None = model
    reward_model: ModelConfig | None = None  # None = model
    roles: RolesConfig = field(default_factory=RolesConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def role_model_field(self, role: str) -> str:
        """The field holding the model a role runs: its record's own field (critic_model, reward_model) when
        set, else `model`."""
        own = role_record(role).own_model_field
        return own if own is not None and getattr(self, own) is not None else "model"

    def role_model(self, role: str) -> ModelConfig:
        """The model a role runs: critic and reward may name their own, the rest run `model`."""
        return getattr(self, self.role_model_field(role))


def with_role_settings(cfg: ExperimentConfig, settings: Mapping[str, Mapping[str, Any]]) -> ExperimentConfig:
    """A copy of `cfg` whose `roles.<role>` fields are replaced by `settings[role]` (field -> value)."""
    updated = {role: dataclasses.replace(cfg.roles.get(role), **fields) for role, fields in settings.items()}
    return dataclasses.replace(cfg, roles=dataclasses.replace(cfg.roles, **updated))


def engine_of(cfg: ExperimentConfig) -> EngineRecord:
    """The record of `cfg.rollout.engine` (a resolved config: not auto)."""
    return get_engine(cfg.rollout.engine)


def syncs_adapters(cfg: ExperimentConfig) -> bool:
    """Whether the rollout engine holds the actor's LoRA adapters over a base synced once, so every later sync
    ships adapters only (`roles.actor.lora.sync`; unset: the engine record's default, the first of its
    `adapter_sync`). False: merged weights (or no adapters). A resolved config: not rollout.engine=auto."""
    lora = cfg.roles.actor.lora
    if not lora.enabled:
        return False
    record = engine_of(cfg)
    modes = record.traits.adapter_sync
    mode = lora.sync or modes[0]
    if mode not in modes:
        raise UserError(f"roles.actor.lora.sync: {mode}, but rollout.engine={cfg.rollout.engine} takes "
                        f"{' or '.join(modes)}; set roles.actor.lora.sync={modes[0]}")
    if mode == "adapters" and record.traits.sleeps and not record.weights_on_host_while_sleeping(
            cfg.rollout.sleep_level):
        raise UserError(f"roles.actor.lora.sync: adapters ships the base weights once, but rollout.sleep_level="
                        f"{cfg.rollout.sleep_level} discards them at every sleep; set rollout.sleep_level=1 (or "
                        "roles.actor.lora.sync=merged)")
    return mode == "adapters"


# A parity gate below this cannot pass where the engine's log-probs are not the trainer's computation in 16-bit
# floats: measured maxima are 0.086-0.099 (vLLM, 1B, H200) and 0.7-0.9 (vLLM and merged LoRA, 135M, H100).
EXACT_GATE_LIMIT = 1e-2


def check_parity_gate(cfg: ExperimentConfig) -> None:
    """Refuse a parity gate (`trainer.parity_max_abs` at rollout_lag 0) that the run's first gated step would fail:
    a gate meant for exact log-probs with an engine whose 16-bit log-probs are its own (vLLM's kernels, the native
    engine given merged W + s B A, a rollout in another dtype than the actor). A resolved config: not auto."""
    trainer, rollout = cfg.trainer, cfg.rollout
    if not trainer.parity_every or trainer.rollout_lag or trainer.parity_max_abs >= EXACT_GATE_LIMIT:
        return
    dtype, own_kernels = rollout.dtype or cfg.model.dtype, engine_of(cfg).traits.trainer_kernels
    measured = "measured max 0.09-0.9 in bf16"
    if dtype != cfg.model.dtype:
        why = f"a {dtype} copy of the {cfg.model.dtype} actor"
    elif dtype == "fp32":  # merged weights part by ~1e-6 in fp32 (CPU tests); vLLM in fp32 is unmeasured
        return
    elif own_kernels and cfg.roles.actor.lora.enabled and not syncs_adapters(cfg):
        why = f"merged LoRA weights (W + s B A rounded) in {dtype}"
    elif own_kernels and cfg.cluster.gpu_type == "cpu":  # on a GPU the same kernels agree to ~2e-6 (H100, bf16)
        why = f"the CPU backend's {dtype} kernels, whose decode steps round unlike the trainer's pass"
        measured = "measured max 5e-3-8e-3 on tiny_cpu"
    elif own_kernels:
        return
    else:
        why = f"its own kernels in {dtype}"
    raise UserError(f"trainer.parity_max_abs: {trainer.parity_max_abs:g} expects the trainer's exact log-probs, "
                    f"but rollout.engine={rollout.engine} samples from {why} ({measured}); "
                    "set trainer.parity_max_abs=2.0 as grpo_smollm2 does, or trainer.parity_every=0")


def with_engine(cfg: ExperimentConfig, name: str) -> ExperimentConfig:
    """`cfg` with rollout.engine=`name` and the engine's defaults filled where unset (trainer.parity_every);
    a shallow copy, `cfg` is left as it is."""
    record = get_engine(name)
    trainer = cfg.trainer
    if trainer.parity_every is None:
        trainer = dataclasses.replace(trainer, parity_every=record.traits.parity_every)
    return dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, engine=name), trainer=trainer)


def longest_sample(cfg: ExperimentConfig) -> int:
    """The most tokens one sample may hold: a single-turn sample is its prompt and one response; a multi-turn
    trajectory (`rollout.environment`) may fill the whole budget, data.seq_length."""
    if cfg.rollout.environment is not None:
        return cfg.data.seq_length
    return min(cfg.data.max_prompt_length + cfg.rollout.max_new_tokens, cfg.data.seq_length)


def finalize_experiment(cfg: ExperimentConfig, checkpoints: CheckpointResolver | None = None) -> ExperimentConfig:
    """Fill derived defaults (checkpoint shapes, GPU figures, ref layout, the engine's defaults) and check every
    field's declared range (`check_bounds`), then the rules between fields.

    `checkpoints` turns `packaged`/`keep_layers` into a checkpoint directory; only the launching process passes
    one (hybridflow.resolve), and ranks read the finished config from plan.json instead of finalizing again."""
    cfg.model = apply_hf_checkpoint(cfg.model, "model", checkpoints)
    for name in own_model_fields():
        if getattr(cfg, name) is not None:
            setattr(cfg, name, apply_hf_checkpoint(getattr(cfg, name), name, checkpoints))
    check_bounds(cfg)
    _check_name(cfg.name)
    check_engine_args(cfg.rollout.engine_args, cfg.rollout.gpu_memory_utilization)  # vLLM's own, before planning
    for name in ("model", *own_model_fields()):
        if getattr(cfg, name) is not None:
            validate_model(getattr(cfg, name), name)
            check_same_vocab(cfg.model, getattr(cfg, name), name)
    cfg.cluster = resolve_cluster(cfg.cluster)
    _inherit_ref_parallel(cfg)
    if cfg.rollout.engine != AUTO:  # auto: the planner resolves the engine, then its defaults (with_engine)
        cfg = with_engine(cfg, cfg.rollout.engine)
    if not cfg.roles.actor.enabled:  # the rollout has no switch: every experiment has one
        raise UserError("roles.actor.enabled: every experiment needs the actor; set it to true")

    if cfg.rollout.environment is not None:
        get_environment(cfg.rollout.environment)  # an unknown name: one line listing the registered ones
    _check_overlong_and_reward(cfg)
    _check_lora(cfg.roles)
    if cfg.rollout.engine != AUTO:  # auto: engine_choice checks each candidate
        syncs_adapters(cfg)  # adapters asked of an engine that takes merged weights only: one line, now
        check_parity_gate(cfg)
    _check_lengths(cfg)
    _check_lr_schedule(cfg)
    return cfg


def _check_name(name: str) -> None:
    """`name` is one path component: the default trainer.output_dir is runs/<name> (an empty name wrote into
    runs/ itself, and ../x outside it)."""
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        raise UserError(f"name: {name!r} is not a plain name (it makes trainer.output_dir runs/<name>); use "
                        "letters, digits, '-', '_' or '.', or set trainer.output_dir for another place")


def rl_optimizer_steps(cfg: ExperimentConfig) -> int:
    """Optimizer steps of the RL run: ppo_epochs x mini-batches per step, times trainer.total_steps."""
    samples = cfg.data.train_batch_size * cfg.rollout.n_samples_per_prompt
    return cfg.trainer.total_steps * cfg.algorithm.ppo_epochs * (samples // cfg.algorithm.mini_batch_size)


def lr_decay_steps(cfg: ExperimentConfig) -> int:
    """trainer.lr_decay_steps, or the RL run's optimizer steps when unset."""
    return cfg.trainer.lr_decay_steps or max(rl_optimizer_steps(cfg), 1)


def _check_lr_schedule(cfg: ExperimentConfig) -> None:
    tr = cfg.trainer
    # megatron's scheduler asserts min_lr <= lr whatever the decay style (a constant one never reaches min_lr)
    for name, lr in (("lr", tr.lr), ("critic_lr", tr.critic_lr)):
        if lr is not None and tr.min_lr > lr:
            raise UserError(f"trainer.min_lr: {tr.min_lr} exceeds trainer.{name}={lr}; a decay goes from {name} "
                            f"down to min_lr (a constant schedule never uses it), so set min_lr <= {lr}")
    if tr.lr_decay_style == "constant":
        return
    decay = lr_decay_steps(cfg)
    if decay <= tr.lr_warmup_steps:
        raise UserError(f"trainer.lr_decay_steps: {decay} does not exceed trainer.lr_warmup_steps="
                        f"{tr.lr_warmup_steps}; the decay ends after the warm-up, so set lr_decay_steps > "
                        f"{tr.lr_warmup_steps} (or lower the warm-up)")


def _inherit_ref_parallel(cfg: ExperimentConfig) -> None:
    ref, actor = cfg.roles.ref.parallel, cfg.roles.actor.parallel
    for name in ("tp", "pp", "sequence_parallel"):
        if getattr(ref, name) is None:
            setattr(ref, name, getattr(actor, name))
    if cfg.roles.ref.micro_batch_size is None:
        cfg.roles.ref.micro_batch_size = cfg.roles.actor.micro_batch_size
    if cfg.roles.ref.max_tokens_per_micro_batch is None:
        cfg.roles.ref.max_tokens_per_micro_batch = cfg.roles.actor.max_tokens_per_micro_batch
    if cfg.roles.ref.forward_max_tokens is None:
        cfg.roles.ref.forward_max_tokens = cfg.roles.actor.forward_max_tokens
    for role in model_roles():  # the rollout's tp is never null (RolloutParallelConfig)
        par = cfg.roles.get(role).parallel
        for name in ("tp", "pp", "sequence_parallel"):
            if getattr(par, name) is None:
                raise UserError(f"roles.{role}.parallel.{name}: is null; set it (tp/pp >= 1)")


def _check_lora(roles: RolesConfig) -> None:
    """Adapters only on trained roles, on at least one linear; a reference that is the actor with its adapters
    off (`reference_is_actor_base`) runs on the actor's model, so at the actor's layout."""
    for role in model_roles():
        lora = roles.get(role).lora
        if lora.enabled and role not in trained_roles():
            raise UserError(f"roles.{role}.lora.rank: {lora.rank} on an untrained role; adapters train, so only "
                            f"{' and '.join(trained_roles())} take them: set roles.{role}.lora.rank=null")
        if lora.sync is not None and role != Role.ACTOR:
            raise UserError(f"roles.{role}.lora.sync: {lora.sync}; only the actor's weights go to the rollout, so "
                            f"set roles.{role}.lora.sync=null")
        if lora.enabled and not lora.target_modules:
            raise UserError(f"roles.{role}.lora.target_modules: [] adapts nothing; list some of qkv, proj, fc1, "
                            f"fc2, or set roles.{role}.lora.rank=null for full fine-tuning")
    if not reference_is_actor_base(roles):
        return
    for name in ("tp", "pp", "dp"):
        ref, actor = getattr(roles.ref.parallel, name), getattr(roles.actor.parallel, name)
        if ref is not None and ref != actor:  # an unset dp: the ref's GPUs (the actor's, checked in the plan)
            raise UserError(f"roles.ref.parallel.{name}: {ref} differs from roles.actor.parallel.{name}={actor}; "
                            "with roles.actor.lora the reference is the actor's model with its adapters off, so "
                            f"set roles.ref.parallel.{name}={actor} (or roles.ref.enabled=false with "
                            "algorithm.kl_coef=0)")


def _check_overlong_and_reward(cfg: ExperimentConfig) -> None:
    # What the named algorithm needs (a critic, groups, loss_agg modes) its record checks before planning
    # (hybridflow.algorithms.registry.check_algorithm); config imports no algorithm.
    alg = cfg.algorithm
    if alg.overlong_buffer > cfg.rollout.max_new_tokens:
        raise UserError(f"algorithm.overlong_buffer: {alg.overlong_buffer} exceeds rollout.max_new_tokens="
                        f"{cfg.rollout.max_new_tokens}; set it to at most that")
    if cfg.roles.reward.enabled != cfg.reward.use_model:
        raise UserError(
            f"roles.reward.enabled: is {cfg.roles.reward.enabled} but reward.use_model is "
            f"{cfg.reward.use_model}; set both to the same value"
        )
    # Built-in tasks bring their own answer-matching reward (hybridflow.rewards) when reward.fn is unset.
    if not cfg.reward.use_model and not cfg.reward.fn and not cfg.data.source.startswith("builtin:"):
        raise UserError(
            f"reward.fn: not set and data.source={cfg.data.source!r} is not a built-in task; "
            "set reward.fn=package.module:function or reward.use_model=true"
        )


def _check_lengths(cfg: ExperimentConfig) -> None:
    need = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    if cfg.data.seq_length < need:
        raise UserError(
            f"data.seq_length: {cfg.data.seq_length} < max_prompt_length + rollout.max_new_tokens = {need}; "
            f"set data.seq_length={need} or shorten them"
        )
    if cfg.data.seq_length > cfg.model.max_position_embeddings:
        raise UserError(
            f"data.seq_length: {cfg.data.seq_length} exceeds model.max_position_embeddings="
            f"{cfg.model.max_position_embeddings}; lower it"
        )
    longest = longest_sample(cfg)
    what = ("data.seq_length (a multi-turn trajectory may fill it)" if cfg.rollout.environment is not None
            else "data.max_prompt_length + rollout.max_new_tokens")
    for role in model_roles():
        budget = cfg.roles.get(role).max_tokens_per_micro_batch
        if cfg.roles.get(role).enabled and budget and budget < longest:
            # A sample is never split over micro-batches: the budget must hold the longest one.
            raise UserError(
                f"roles.{role}.max_tokens_per_micro_batch: {budget} is below the longest sample, "
                f"{what} = {longest}; set it to >= {longest}, or 0 (off)"
            )
    samples = cfg.data.train_batch_size * cfg.rollout.n_samples_per_prompt
    if samples % cfg.algorithm.mini_batch_size:
        raise UserError(
            f"algorithm.mini_batch_size: {cfg.algorithm.mini_batch_size} does not divide the "
            f"{samples} samples per step (data.train_batch_size x rollout.n_samples_per_prompt); "
            "use a divisor"
        )
