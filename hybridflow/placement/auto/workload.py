"""What one RLHF iteration asks of each role: model shapes, token counts, and the stages of the dataflow.

The search and the cost model work on these small frozen records rather than on `ExperimentConfig`, so they
can be exercised with hand-built workloads; `from_config.workload_from_config` builds them from a config.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybridflow.families import resolved_head_dim
from hybridflow.placement.param_count import layer_lora_params, layer_matmul_params
from hybridflow.role_records import Role, Stage, role_record

# The dataflow of one PPO iteration (hybridflow.role_records.Stage), by the short names the cost model reads.
GENERATION, PREPARATION, TRAINING = Stage.GENERATION, Stage.PREPARATION, Stage.TRAINING
STAGES = tuple(Stage)


@dataclass(frozen=True)
class ModelCostShape:
    """The figures of a decoder-only transformer that decide its cost and memory."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tie_embeddings: bool = False
    dtype_bytes: int = 2
    head: str = "lm"  # "lm" (vocab logits) | "value" | "reward" (one scalar per token)
    # The per-head width; None = hidden_size / num_heads (`hybridflow.families.resolved_head_dim`, the runtime's
    # rule). `from_config` passes the checkpoint's.
    head_dim: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "head_dim", resolved_head_dim(self.hidden_size, self.num_heads, self.head_dim))

    @property
    def q_dim(self) -> int:
        """Width of all query heads together (num_heads x head_dim)."""
        return self.num_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        return layer_matmul_params(self.hidden_size, self.intermediate_size, self.num_kv_heads * self.head_dim,
                                   self.q_dim)

    @property
    def layer_params(self) -> int:
        return self.layer_matmul_params + 2 * self.hidden_size  # + two RMSNorm weights

    @property
    def output_params(self) -> int:
        """Parameters of the output projection (lm head, or the scalar head of a value/reward model)."""
        return self.vocab_size * self.hidden_size if self.head == "lm" else self.hidden_size

    @property
    def params(self) -> int:
        embedding = self.vocab_size * self.hidden_size
        tied = self.head == "lm" and self.tie_embeddings
        return self.num_layers * self.layer_params + embedding + (0 if tied else self.output_params)

    @property
    def matmul_params(self) -> int:
        """Weights that are multiplied per token: every layer's matmuls and the output projection (not the
        embedding, a lookup, nor the norms)."""
        return self.num_layers * self.layer_matmul_params + self.output_params

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    def forward_flops_per_token(self, context: float) -> float:
        """Matmul FLOPs of one token's forward pass attending to `context` earlier tokens on average: 2 per
        matmul weight plus QK^T and AV (2 * 2 * heads * head_dim per attended token and layer). The project's
        one FLOP formula: the planner passes the causal mean context (seq / 2), PaLM-style MFU the full seq."""
        return 2 * self.matmul_params + 4 * self.num_layers * self.q_dim * context

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def lora_params(self, rank: int, targets: tuple[str, ...] | list[str]) -> int:
        """LoRA adapter weights of the whole model at TP 1 (`roles.<role>.lora`: rank, target_modules)."""
        return self.num_layers * layer_lora_params(self.hidden_size, self.intermediate_size,
                                                   self.num_kv_heads * self.head_dim, self.q_dim, rank, targets, 1)


@dataclass(frozen=True)
class RoleWork:
    """One role of the dataflow: its model and the stages it runs in (`train` = it has an optimizer)."""

    name: str
    model: ModelCostShape
    stages: tuple[str, ...]
    micro_batch_size: int = 1
    # Most rows per micro-batch of a forward-only pass and of an update, as the runtime sizes them
    # (RoleConfig.forward_micro_batch_size / update_micro_batch_size at data.seq_length); 0 = micro_batch_size.
    forward_micro_batch_size: int = 0
    update_micro_batch_size: int = 0
    # Share of the optimizer megatron's HybridDeviceOptimizer steps on the host (roles.<role>.offload_fraction
    # with offload_optimizer; 0 = all on the GPU).
    offload_fraction: float = 0.0
    # Forward passes over the batch in preparation, per step on average: 1, +1 for an actor whose model also gives
    # the reference's log-probs (adapters off: config.parallel.reference_is_actor_base), and an actor taking pi_old
    # from the rollout recomputes it only on parity steps (1 / trainer.parity_every).
    preparation_passes: float = 1.0
    # LoRA adapter weights of the whole model (`ModelCostShape.lora_params`): the update trains only them over
    # the frozen base (no weight-gradient GEMMs, gradients or optimizer state for it); 0 = full training.
    adapter_params: int = 0
    # A generating role whose rollout engine holds its adapters (hybridflow.config.experiment.syncs_adapters):
    # each sync ships the adapters, not the model (the base goes once, outside the iteration).
    syncs_adapters: bool = False
    # data.seq_length where the role splits sequences over TP (placement.checks.sequence_parallel_width), which
    # its TP must divide; 0: no such split.
    sequence_parallel_width: int = 0

    @property
    def trained_params(self) -> int:
        """Weights that get gradients, optimizer state and the DP sync: the adapters, or the whole model."""
        return self.adapter_params or self.model.params

    @property
    def synced_bytes(self) -> int:
        """Bytes the bridge ships to the rollout per iteration (whole-model figure, before resharding)."""
        return self.adapter_params * self.model.dtype_bytes if self.syncs_adapters else self.model.weight_bytes

    @property
    def trains(self) -> bool:
        return TRAINING in self.stages

    @property
    def generates(self) -> bool:
        return GENERATION in self.stages

    @property
    def generates_only(self) -> bool:
        """A rollout on GPUs of its own: no training layout, its mesh is the generation layout."""
        return self.stages == (GENERATION,)


@dataclass(frozen=True)
class Workload:
    """Batch figures of one iteration and the roles that take part.

    At `rollout_lag` 0 the actor carries generation: the rollout engine lives on the actor's GPUs and
    receives its weights through the resharding bridge (HybridFlow's 3D-HybridEngine), so it is not a
    separate set member. At `rollout_lag` 1 (one-step-off) generation is a rollout role of its own
    (`split_rollout`) that the search keeps off the actor's GPUs.
    """

    roles: tuple[RoleWork, ...]
    prompts: int
    samples_per_prompt: int
    prompt_length: int
    response_length: int
    mini_batch_size: int  # samples per optimizer step
    # A registered engine's name (hybridflow.engines): its record's decode terms price generation. No default:
    # the config's engine (`workload_from_config`) or the caller's choice, never one assumed here.
    rollout_engine: str
    ppo_epochs: int = 1
    # The rollout copies its weight shard to host memory when it sleeps after generating and back when it
    # wakes before the bridge writes new weights (the engine record's weights_on_host_while_sleeping).
    rollout_offloads_weights: bool = False
    # 1: the rollout generates batch k+1 on its own GPUs while the other roles consume batch k.
    rollout_lag: int = 0

    def __post_init__(self) -> None:
        if self.rollout_lag and not any(r.name == Role.ROLLOUT and r.generates_only for r in self.roles):
            raise ValueError("Workload: rollout_lag=1 needs a generation-only 'rollout' role (split_rollout)")

    @property
    def samples(self) -> int:
        return self.prompts * self.samples_per_prompt

    @property
    def sequence_length(self) -> int:
        return self.prompt_length + self.response_length

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.roles)

    def role(self, name: str) -> RoleWork:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)


def split_rollout(roles: tuple[RoleWork, ...]) -> tuple[RoleWork, ...]:
    """The roles of a one-step-off run: the actor hands GENERATION to a rollout role of its own model
    (appended last), keeping preparation (old log-probs) and training."""
    out: list[RoleWork] = []
    rollout: RoleWork | None = None
    for r in roles:
        if r.generates:
            rollout = RoleWork(Role.ROLLOUT, r.model, role_record(Role.ROLLOUT).stages,
                               adapter_params=r.adapter_params, syncs_adapters=r.syncs_adapters)  # its sync bytes
            r = replace(r, stages=tuple(s for s in r.stages if s != GENERATION))
        out.append(r)
    if rollout is None:
        raise ValueError("split_rollout: no role generates")
    return (*out, rollout)
