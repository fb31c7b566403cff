"""The rollout role: an engine per generation DP replica, fed by the weight bridge after each update."""

from __future__ import annotations

import importlib
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch
import torch.distributed as dist

from hybridflow.data.step_batch import StepBatch
from hybridflow.engines import get_engine
from hybridflow.placement import RoleMesh
from hybridflow.roles.model_role import ModelRole
from hybridflow.roles.replica_results import share_from_role
from hybridflow.rollout.base import EngineSetup, RolloutBatch, RolloutBuilder, RolloutEngine, SamplingParams
from hybridflow.rollout.turns import (
    TRAJECTORY_COLUMNS,
    TurnSettings,
    engine_sampler,
    environment_rewards,
    episodes_to_batch,
    run_turns,
    start_episode,
    turn_metrics,
)
from hybridflow.units import GIB
from megatron_adapters.bridge import ReshardStats, WeightBridge, training_shards
from megatron_adapters.checkpoint import unwrap
from megatron_adapters.lora import adapters_merged
from megatron_adapters.model import model_shape


class LocalSamples(NamedTuple):
    """One replica's samples before they are shared (tensors None off the rollout); `with_logprobs` says whether
    log-probs were asked for, so every rank knows whether `share` sends them."""

    tokens: torch.Tensor | None
    token_kinds: torch.Tensor | None
    logprobs: torch.Tensor | None
    with_logprobs: bool
    turn_stats: torch.Tensor | None = None  # [rows, len(TRAJECTORY_COLUMNS)] of a multi-turn rollout


@dataclass
class RolloutRole:
    """`mesh` lists the rollout ranks in the bridge's generation order (TP_g groups are consecutive)."""

    mesh: RoleMesh
    engine: RolloutEngine | None  # None on ranks outside the rollout
    bridge: WeightBridge
    sampling: SamplingParams
    device: torch.device
    step: int = 0
    last_sync: ReshardStats | None = None
    memory: dict[str, float] = field(default_factory=dict)  # rollout/* GiB freed by sleep, taken by wake (CUDA)
    turns: TurnSettings | None = None  # rollout.environment's turn loop; None: single turn
    turn_metrics: dict[str, float] = field(default_factory=dict)  # turns/*, tools/* of the last batch shared
    turn_stats: torch.Tensor | None = None  # [B, len(TRAJECTORY_COLUMNS)] of the last batch shared (validation)

    def generate(self, batch: StepBatch, logprobs: bool = False) -> None:
        """Sample responses for this replica's rows and share tokens, token kinds (and log-probs, if asked for)
        with every rank."""
        self.share(batch, self.generate_local(batch, logprobs))

    def generate_local(self, batch: StepBatch, logprobs: bool = False) -> LocalSamples:
        """This replica's samples of its rows of `batch` (tensors None off the rollout); log-probs only if
        asked for (every rank must ask alike). Collective only inside the rollout's own groups, so other ranks
        never wait for it."""
        rows = batch.size
        local = LocalSamples(None, None, None, logprobs)
        if self.engine is not None:
            dp_rank = self.mesh.coords(dist.get_rank())[1]
            mine = slice(dp_rank * rows // self.mesh.dp, (dp_rank + 1) * rows // self.mesh.dp)
            sampling = replace(self.sampling, seed=self.sampling.seed + 7919 * self.step + dp_rank, logprobs=logprobs)
            prompts = RolloutBatch(batch.tokens[mine].to(self.device), batch.prompt_lens[mine].to(self.device))
            stats = None
            if self.turns is None:
                out = self.engine.generate(prompts, sampling)
            else:
                out, stats = self._run_turns(prompts, batch.rows[mine], sampling)
            if logprobs and out.logprobs is None:
                raise RuntimeError("the rollout engine returned no log-probs although they were asked for")
            # hand the KV cache (and, at sleep level 2, weights) back to training
            self._track("rollout/sleep_freed_gib", self.engine.sleep, sign=1.0)
            local = LocalSamples(out.tokens, out.token_kinds, out.logprobs if logprobs else None, logprobs, stats)
        self.step += 1
        return local

    def _run_turns(self, prompts: RolloutBatch, rows: list[dict], sampling: SamplingParams
                   ) -> tuple[RolloutBatch, torch.Tensor]:
        """The multi-turn rollout of these prompts (hybridflow.rollout.turns) and its per-row counts."""
        lens = prompts.prompt_lens.tolist()
        episodes = [start_episode(prompts.tokens[i, : lens[i]].tolist(), row, self.turns)
                    for i, row in enumerate(rows)]
        run_turns(episodes, engine_sampler(self.engine, sampling, sampling.pad_token_id, self.device), self.turns)
        out = episodes_to_batch(episodes, prompts.tokens.shape[1], sampling.pad_token_id, self.device,
                                sampling.logprobs)
        return out, torch.tensor([e.stats() for e in episodes], dtype=torch.float32, device=self.device)

    def share(self, batch: StepBatch, local: LocalSamples) -> None:
        """Put `generate_local`'s results of every replica into `batch` on every rank (collective over all);
        `batch.rollout_logprobs` is None when they were not asked for."""
        rows, shape = batch.size, (batch.tokens.shape[1],)
        batch.tokens = share_from_role(local.tokens, self.mesh, rows, shape, torch.long, self.device).cpu()
        batch.token_kinds = share_from_role(local.token_kinds, self.mesh, rows, shape, torch.long,
                                            self.device).cpu()
        batch.rollout_logprobs = None
        if self.turns is not None:
            stats = share_from_role(local.turn_stats, self.mesh, rows, (len(TRAJECTORY_COLUMNS),), torch.float32,
                                    self.device).cpu()
            self.turn_stats, self.turn_metrics = stats, turn_metrics(stats)
            batch.env_rewards = environment_rewards(stats)
        if local.with_logprobs:
            batch.rollout_logprobs = share_from_role(local.logprobs, self.mesh, rows, shape, torch.float32,
                                                     self.device).cpu()

    def sync(self, actor: ModelRole | None) -> None:
        """Reshard the actor's current weights into the engine (collective over actor and rollout ranks); an
        actor with LoRA adapters ships merged weights (W + alpha/rank B A, its base restored bitwise after)."""
        if self.engine is not None:
            self._track("rollout/wake_weights_taken_gib", lambda: self.engine.wake_up(("weights",)))
        targets = self.engine.weight_tensors() if self.engine is not None else {}
        on_bucket = self.engine.bucket_written if self.engine is not None else None
        model = unwrap(actor.model) if actor is not None else None
        with adapters_merged(model) if model is not None else nullcontext():  # merged only while shipped
            src = training_shards(model) if model is not None else {}
            _, self.last_sync = self.bridge.reshard(src, targets, on_bucket)
        if self.engine is not None:
            self.engine.weights_written()
            self._track("rollout/wake_kv_taken_gib", lambda: self.engine.wake_up(("kv_cache",)))

    def _track(self, key: str, call, sign: float = -1.0) -> None:
        """Run `call` and record in `memory[key]` how much free device memory it gave (+) or took (-1 x)."""
        before = _free_gib()
        call()
        if before is not None:
            self.memory[key] = sign * (_free_gib() - before)


def _free_gib() -> float | None:
    """Free device memory as the driver sees it (vLLM's sleep allocator frees outside torch's caching
    allocator, so torch.cuda.memory_allocated would not show it); None without CUDA."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0] / GIB


NOT_STARTED = object()  # build_rollout_role's default: the engine's builder starts when the role is built


def start_rollout(engine: str, setup: EngineSetup) -> object:
    """Begin engine `engine`'s early work (its builder's `start`) before the models build; collective. What it
    returns is `build_rollout_role`'s `started`."""
    return resolve_builder(get_engine(engine).builder).start(setup)


def build_rollout_role(
    engine: str, setup: EngineSetup, reshard_plan, sampling: SamplingParams, started: object = NOT_STARTED,
    bucket_bytes: int = 256 << 20, turns: TurnSettings | None = None,
) -> RolloutRole:
    """The rollout engine `engine` (a registered name, the plan's rollout_engine) on its ranks and the bridge
    that feeds it, from `start_rollout`'s `started` (by default the builder starts here); `turns` makes every
    generation a multi-turn rollout (rollout.environment). Collective.

    The engine's record names its builder as an import path (hybridflow.engines); it is resolved here, the
    one place that imports engine code, and says which layout the bridge writes and whether it stages it.
    """
    builder = resolve_builder(get_engine(engine).builder)
    if started is NOT_STARTED:
        started = builder.start(setup)
    bridge = WeightBridge(reshard_plan, model_shape(setup.hf_dir), builder.target, dtype=setup.dtype,
                          bucket_bytes=bucket_bytes, device=setup.device, staged=builder.staged)
    return RolloutRole(setup.mesh, builder.build(setup, bridge, started), bridge, sampling, setup.device,
                       turns=turns)


def resolve_builder(path: str) -> RolloutBuilder:
    """The `RolloutBuilder` an engine record names as "package.module:ATTRIBUTE"."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)
