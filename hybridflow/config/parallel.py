"""Per-role parallel layout and batch sizes. Every role has its own TP/PP/DP mesh."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.config.bounds import bounded
from hybridflow.role_records import role_names

# What each mode sets in megatron: hybridflow.roles.model_role.RECOMPUTE_OVERRIDES (same keys; a test ties them).
RECOMPUTE_MODES = ("none", "selective", "full")
# Linears of a layer that can carry LoRA adapters (megatron_adapters.lora.LORA_TARGETS without "linear_"; a test
# ties them): fused q/k/v, attention output, fused gate/up, down.
LORA_TARGET_MODULES = ("qkv", "proj", "fc1", "fc2")
# How the rollout gets an adapted actor's weights (`roles.actor.lora.sync`): "merged" ships W + alpha/rank B A
# through the bridge every sync (the whole model); "adapters" ships the base once, then lora_a / lora_b only.
LORA_SYNC_MODES = ("merged", "adapters")


@dataclass
class ParallelConfig:
    """Degrees of one role's mesh. `dp=None` means: the role's GPU count / (tp * pp).

    `tp`/`pp`/`sequence_parallel` are None only in ref's defaults, meaning "the actor's"; after
    `load_experiment` every role has integers here. The planner turns these settings into the role's one
    checked layout type, `hybridflow.placement.mesh.ParallelDims` (`planner.role_dims`).
    """

    tp: int | None = bounded(1, ge=1)
    pp: int | None = bounded(1, ge=1)
    dp: int | None = bounded(None, ge=1)
    # Megatron's sequence parallelism (only meaningful when tp > 1); the memory estimator uses it.
    sequence_parallel: bool | None = True


@dataclass
class LoraConfig:
    """`roles.<role>.lora`: LoRA adapters on `target_modules` (scale alpha / rank) of a trained role (actor,
    critic); every other weight is frozen (no grads, optimizer state or DDP buckets). `rank` null = no adapters,
    full fine-tuning (so `roles.actor.lora.rank=32` alone turns them on)."""

    rank: int | None = bounded(None, ge=1)
    alpha: float = bounded(32.0, gt=0)
    dropout: float = bounded(0.0, ge=0, lt=1)
    target_modules: list[str] = bounded(default_factory=lambda: list(LORA_TARGET_MODULES),
                                        choices=LORA_TARGET_MODULES)
    # the actor's only; null: "adapters" where the rollout engine takes adapters (the native one), else "merged"
    sync: str | None = bounded(None, choices=LORA_SYNC_MODES)

    @property
    def enabled(self) -> bool:
        return self.rank is not None


@dataclass
class RoleConfig:
    """One role: whether it runs, its mesh, its micro-batch size (samples per forward/backward)."""

    enabled: bool = True
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    micro_batch_size: int | None = bounded(1, ge=1)  # None (ref's default): the actor's
    # Sequence packing (model roles; the rollout ignores it): micro-batches hold whole samples up to this many
    # tokens (no padding) instead of `micro_batch_size` rows. 0 = off. None = off, except ref's default:
    # the actor's value.
    max_tokens_per_micro_batch: int | None = bounded(None, ge=0)
    # Forward-only passes (reference and old log-probs, values, rewards) on padded rows run
    # `forward_micro_batch_size(data.seq_length)` rows per micro-batch: this token budget over the sequence
    # length, at least `micro_batch_size` (the update keeps `micro_batch_size`). 0 = `micro_batch_size`.
    # None = ref's default: the actor's value.
    forward_max_tokens: int | None = bounded(16384, ge=0)
    # The update (trained roles, padded rows; the supervised warm-up too) runs
    # `update_micro_batch_size(data.seq_length)` rows per micro-batch: this token budget over the sequence
    # length, at least `micro_batch_size`. Every loss_agg mode gives the same gradient however a mini-batch is
    # split (hybridflow/algorithms/losses/loss_agg.py). 0 = exactly `micro_batch_size` rows (the explicit
    # override). None (default): the planner picks the largest budget that fits the GPUs, up to 16384 tokens
    # (hybridflow/placement/update_budget.py); the run uses the plan's value.
    update_max_tokens: int | None = bounded(None, ge=0)
    offload_optimizer: bool = False
    # With offload_optimizer: the share of the optimizer (fp32 master params + Adam states) megatron's
    # HybridDeviceOptimizer keeps and steps on the host (OptimizerConfig.optimizer_offload_fraction; 1.0 =
    # all of it). None: the planner picks the smallest share that fits the GPU, then checks host memory.
    offload_fraction: float | None = bounded(None, ge=0, le=1)
    # "none" | "selective" (attention scores not kept, Korthikanti et al.: the fused attention of the "te" and
    # "sdpa" specs keeps none, so only the unfused "local" spec, and packed micro-batches off the flash varlen
    # kernel (fp32, CPU), recompute their core attention) | "full" (whole layer)
    activation_recompute: str = bounded("selective", choices=RECOMPUTE_MODES)
    # LoRA adapters (actor, critic); rank null = full fine-tuning.
    lora: LoraConfig = field(default_factory=LoraConfig)

    def forward_micro_batch_size(self, seq_length: int) -> int:
        """Rows per forward-only micro-batch of padded `seq_length`-token rows (see `forward_max_tokens`)."""
        return max(self.micro_batch_size, (self.forward_max_tokens or 0) // seq_length)

    def update_micro_batch_size(self, seq_length: int, max_tokens: int | None = None) -> int:
        """Most rows per update micro-batch of padded `seq_length`-token rows under the budget `max_tokens`
        (default: `update_max_tokens`, unset counting as 0 = `micro_batch_size` rows; the run passes the plan's)."""
        budget = self.update_max_tokens if max_tokens is None else max_tokens
        return max(self.micro_batch_size, (budget or 0) // seq_length)


def micro_batch_split(rows: int, max_rows: int) -> tuple[int, int]:
    """(count, size): `rows` rows cut into as few micro-batches of at most `max_rows` as possible, all of `size`
    rows but the last (256 rows at most 85 a piece: 4 x 64, not 3 x 85 + 1). The runtime splits so
    (ModelRole.micro_batches) and the memory model sizes activations so (placement/memory.py)."""
    count = -(-rows // max(1, min(max_rows, rows)))
    return count, -(-rows // count)


@dataclass
class RolloutParallelConfig:
    """The rollout's mesh: TP and DP only (`dp=None`: its GPU count / tp). It generates at pipeline size 1
    (the bridge's generation layout), so `pp` is always 1 and not a setting."""

    tp: int = bounded(1, ge=1)
    dp: int | None = bounded(None, ge=1)

    @property
    def pp(self) -> int:
        return 1


@dataclass
class RolloutRoleConfig:
    """The rollout role: only its mesh. It holds no trained model (no optimizer, offload, recompute or
    micro-batches); what it samples with, its engine and dtype are `rollout.*`. Every experiment has it."""

    parallel: RolloutParallelConfig = field(default_factory=RolloutParallelConfig)

    @property
    def enabled(self) -> bool:
        return True


@dataclass
class RolesConfig:
    actor: RoleConfig = field(default_factory=RoleConfig)
    critic: RoleConfig = field(default_factory=RoleConfig)
    # ref's unset parallel fields, micro-batch and token budgets inherit the actor's (same model, usually the
    # same GPUs).
    ref: RoleConfig = field(
        default_factory=lambda: RoleConfig(parallel=ParallelConfig(tp=None, pp=None, sequence_parallel=None),
                                           micro_batch_size=None, max_tokens_per_micro_batch=None,
                                           forward_max_tokens=None)
    )
    reward: RoleConfig = field(default_factory=lambda: RoleConfig(enabled=False))
    rollout: RolloutRoleConfig = field(default_factory=RolloutRoleConfig)

    def get(self, role: str) -> RoleConfig | RolloutRoleConfig:
        return getattr(self, role)

    def enabled_roles(self) -> tuple[str, ...]:
        """Enabled roles in canonical order (actor, critic, ref, reward, rollout)."""
        return tuple(r for r in role_names() if self.get(r).enabled)


def reference_is_actor_base(roles: RolesConfig) -> bool:
    """Whether the reference role is the actor's model with its adapters off (the actor trains LoRA adapters)
    rather than a model of its own: no second copy of the weights, and the ref's mesh is the actor's. The one
    place this is decided: the config and plan checks, the planner's memory and auto search and the run's build
    ask it."""
    return roles.ref.enabled and roles.actor.lora.enabled
