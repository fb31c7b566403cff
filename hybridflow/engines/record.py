"""What a rollout engine is to the rest of hybridflow: one record per engine, found by name.

The record holds the engine's pure facts (traits, its memory and cost-model terms, the package it needs) so
the config, the planner and the environment check can ask it without importing torch, megatron-core or the
engine. How to build the engine for a rollout rank is named, not imported: `builder` is an import path
("package.module:ATTRIBUTE") that only `hybridflow.roles.rollout_role` resolves, at build time, to an
`RolloutBuilder` (hybridflow.rollout.base). A record takes plain values (never the experiment config): this
package imports only the leaves hybridflow.errors and hybridflow.registry, so hybridflow.config and
hybridflow.placement may import it. What the config does with a record (`with_engine`, `engine_of`) is
hybridflow.config.experiment's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from hybridflow.errors import UserError
from hybridflow.registry import Registry

AUTO = "auto"  # rollout.engine=auto: the planner picks the engine its cost model predicts faster


@dataclass(frozen=True)
class PackageRequirement:
    """A distribution the engine needs, the versions it works with, and the setup.py extra that installs it."""

    distribution: str
    versions: str  # a PEP 440 specifier, e.g. ">=0.20,<0.35"
    extra: str


@dataclass(frozen=True)
class EngineTraits:
    """What the planner and the runtime may rely on.

    gpu_only: runs on CUDA GPUs only (refused on a cpu cluster at plan time and without CUDA at run time).
    sleeps: frees its KV cache between generations (and, `weights_on_host_while_sleeping`, moves weights).
    supports_rollout_lag: can generate on GPUs of its own while the actor trains (trainer.rollout_lag=1).
    shares_actor_weights: colocated at the actor's layout (TP, PP 1) and dtype, it reads the actor's weight
        tensors in place and holds none of its own.
    replicates_kv_heads: its TP may exceed num_key_value_heads (each rank keeps a copy of a KV head).
    logprobs_free: its sampling log-probs cost nothing extra; `parity_every` is trainer.parity_every's
        default (how often the actor's recomputed log-probs are compared with the engine's).
    separate_process: runs in an engine process per rollout rank (its own host memory; the bridge writes
        through a staging buffer).
    package: the distribution it needs beyond hybridflow's own (None: nothing extra).
    adapter_sync: how it can be given an actor's LoRA adapters (roles.actor.lora.sync), its default first:
        "merged" (W + s B A through the bridge every sync) and/or "adapters" (the base once, then the adapters).
    trainer_kernels: it samples from the trainer's own modules, so its log-probs are the actor's computation
        (to ~1e-6 in bf16) unless merged adapters round W + s B A first; otherwise its kernels differ from the
        trainer's and in bf16 they part by 0.1-0.9 at some token (`hybridflow.config.experiment.check_parity_gate`).
    """

    gpu_only: bool
    sleeps: bool
    supports_rollout_lag: bool
    shares_actor_weights: bool
    replicates_kv_heads: bool
    logprobs_free: bool
    parity_every: int
    separate_process: bool
    package: PackageRequirement | None = None
    adapter_sync: tuple[str, ...] = ("merged",)
    trainer_kernels: bool = False


@dataclass(frozen=True)
class DecodeTerms:
    """One decode step of the engine in the cost model: the share of HBM bandwidth its weight and KV stream
    reaches, a launch latency per layer, and a host time per step (fixed, or growing with the batch)."""

    hbm_efficiency: float
    layer_launch_s: float
    step_host_s: float


class EngineRecord(Protocol):
    """A rollout engine's record (see the module docstring). Implementations: hybridflow.engines.megatron,
    hybridflow.engines.vllm."""

    name: str
    traits: EngineTraits
    builder: str  # "package.module:ATTRIBUTE" of its RolloutBuilder, resolved by the rollout role only

    def kv_cache_bytes(self, gpu_memory_utilization: float, gpu_memory_gib: float, weights: int,
                       batch_kv: int) -> int:
        """KV cache bytes per rollout GPU, given rollout.gpu_memory_utilization, the GPU's memory
        (cluster.gpu_memory_gib), the GPU's weight shard (`weights`, 0 when shared with the actor) and what this
        DP replica's batch needs at full length (`batch_kv`). Raises UserError (naming the field) when the
        engine cannot run at all with these figures."""
        ...

    def weights_on_host_while_sleeping(self, sleep_level: int) -> bool:
        """Whether sleeping at rollout.sleep_level moves the weight shard to host memory (and waking brings
        it back)."""
        ...

    def process_host_bytes(self) -> int:
        """Host memory of the engine's own process per rollout rank (0 when it runs in the training process)."""
        ...

    def decode_terms(self, eff: Any, rows: int, hidden_size: int) -> DecodeTerms:
        """The decode-step terms for a wave of `rows` sequences of a `hidden_size` model, from the cost model's
        figures `eff` (hybridflow.placement.auto.device.Efficiency: the engine reads its own fields)."""
        ...


_ENGINES: Registry[EngineRecord] = Registry("engine", "rollout.engine", reserved=(AUTO,))


def register_engine(record: EngineRecord) -> EngineRecord:
    """Add `record` under its name (once per name); returns it."""
    return _ENGINES.add(record.name, record)


def engine_names() -> tuple[str, ...]:
    """The registered engines, in registration order (the native engine first)."""
    return _ENGINES.names()


def get_engine(name: str) -> EngineRecord:
    """The record of engine `name`; `auto` is not an engine (the planner resolves it first)."""
    if name == AUTO:
        raise UserError("rollout.engine: auto is resolved by the planner (hybridflow.placement.plan_placement); "
                        "ask the plan's rollout_engine, or set rollout.engine to one of " + ", ".join(engine_names()))
    return _ENGINES.get(name)
