"""The rollout role: an engine per generation DP replica, fed by the weight bridge after each update."""

from __future__ import annotations

import importlib
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
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
from megatron_adapters.bridge.adapters import adapter_shards, adapter_tensors
from megatron_adapters.checkpoint import unwrap
from megatron_adapters.lora import adapters_disabled, adapters_merged
from megatron_adapters.model import model_shape
from megatron_adapters.peft_export import ADAPTER_WEIGHTS, save_peft_adapter


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
    # An engine that holds the actor's LoRA adapters (`EngineSetup.lora`) gets the base on the first sync and the
    # adapters on every one: through the bridge into its own adapter tensors (`adapter_bridge`, the native
    # engine) or as a PEFT directory it loads itself (`adapter_dir`, vLLM). Neither: merged weights every sync.
    adapter_bridge: WeightBridge | None = None
    adapter_dir: Path | None = None
    hf_dir: str = ""  # the base model the PEFT adapter names
    base_synced: bool = False
    # The engine's record trait: colocated at the actor's layout it can read the actor's tensors in place
    # (`_share`), as the planner counts it (placement.memory.rollout_shares_actor_weights).
    shares_actor_weights: bool = False

    def close(self) -> None:
        """Stop the engine's own process where it has one (vLLM's, `engine_host`), at the end of a run."""
        close = getattr(self.engine, "close", None)  # an in-process engine (the native one) has nothing to stop
        if close is not None:
            close()

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
        """Reshard the actor's current weights into the engine (collective over actor and rollout ranks). An
        actor with LoRA adapters ships merged weights (W + alpha/rank B A, its base restored bitwise after), or,
        with `adapter_bridge` / `adapter_dir`, its frozen base on the first sync and its adapters on every one."""
        if self.engine is not None:
            self._track("rollout/wake_weights_taken_gib", lambda: self.engine.wake_up(("weights",)))
        targets = self.engine.weight_tensors() if self.engine is not None else {}
        on_bucket = self.engine.bucket_written if self.engine is not None else None
        model = unwrap(actor.model) if actor is not None else None
        if self.adapter_bridge is None and self.adapter_dir is None:
            adapted = model is not None and getattr(model, "lora", None) is not None
            with adapters_merged(model) if model is not None else nullcontext():  # merged only while shipped
                src = training_shards(model) if model is not None else {}
                if not adapted and self._share(src):  # the engine reads the actor's (full) weights in place
                    self.last_sync = ReshardStats(0.0, 0, 0, 0)
                else:
                    _, self.last_sync = self.bridge.reshard(src, targets, on_bucket)
        else:
            self.last_sync = self._sync_adapters(model, targets, on_bucket)
        if self.engine is not None:
            self.engine.weights_written()
            self._track("rollout/wake_kv_taken_gib", lambda: self.engine.wake_up(("kv_cache",)))

    def _sync_adapters(self, model, targets: dict[str, torch.Tensor], on_bucket) -> ReshardStats:
        """The base (once: it is frozen) and then the adapters, each into its own engine tensors, or (an engine
        that loads them from files) written as a PEFT adapter that every rollout rank's engine then loads."""
        adapter_names = self.adapter_bridge.target_shapes().keys() if self.adapter_bridge is not None else ()
        stats = None
        if not self.base_synced:
            base = {name: t for name, t in targets.items() if name not in adapter_names}
            with adapters_disabled(model) if model is not None else nullcontext():
                src = training_shards(model) if model is not None else {}
                if not self._share(src):
                    _, stats = self.bridge.reshard(src, base, on_bucket)
            self.base_synced = True
        if self.adapter_bridge is not None:
            adapters = {name: targets[name] for name in adapter_names}
            _, shipped = self.adapter_bridge.reshard(adapter_shards(model) if model is not None else {}, adapters)
        else:
            start = time.perf_counter()
            if model is not None:  # collective over the actor's ranks; its first writes the files
                save_peft_adapter(model, self.adapter_dir, self.hf_dir)
            dist.barrier()  # the files are complete before any engine reads them
            written = 0
            if self.engine is not None:
                self.engine.load_adapter(str(self.adapter_dir))
                written = (self.adapter_dir / ADAPTER_WEIGHTS).stat().st_size
            shipped = ReshardStats(time.perf_counter() - start, 0, 0, written)
        return shipped if stats is None else stats + shipped

    def _share(self, src: dict[str, torch.Tensor]) -> bool:
        """Colocated at the actor's layout (same TP, PP 1) an engine that can (`shares_actor_weights`, the native
        one) takes the actor's tensors themselves: no second copy, as the planner counts it
        (placement.memory.rollout_shares_actor_weights). Full fine-tuning: the optimizer updates them in place,
        so every later sync ships nothing; LoRA: the frozen base, and then only adapters move. The reshard would
        be local copies only there (no collective), so a rank may decide alone; False: ship it."""
        if not self.shares_actor_weights or self.engine is None or not src:
            return False
        plan = self.bridge.plan
        return (plan.colocated and plan.gen.tp == plan.train.tp and plan.train.pp == 1
                and self.engine.share_weights(src))

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
    bucket_bytes: int = 256 << 20, turns: TurnSettings | None = None, adapter_dir: Path | None = None,
) -> RolloutRole:
    """The rollout engine `engine` (a registered name, the plan's rollout_engine) on its ranks and the bridge
    that feeds it, from `start_rollout`'s `started` (by default the builder starts here); `turns` makes every
    generation a multi-turn rollout (rollout.environment); `setup.lora` (the actor's adapters, for an engine that
    takes them) makes syncs ship the base once and then adapters only: through the bridge, or for an engine that
    loads them from files (its builder's `adapters_from_files`) as a PEFT adapter in `adapter_dir`. Collective.

    The engine's record names its builder as an import path (hybridflow.engines); it is resolved here, the
    one place that imports engine code, and says which layout the bridge writes and whether it stages it.
    """
    builder = resolve_builder(get_engine(engine).builder)
    if started is NOT_STARTED:
        started = builder.start(setup)
    bridge = WeightBridge(reshard_plan, model_shape(setup.hf_dir), builder.target, dtype=setup.dtype,
                          bucket_bytes=bucket_bytes, device=setup.device, staged=builder.staged)
    adapter_bridge = files = None
    if setup.lora is not None and builder.adapters_from_files:
        if adapter_dir is None:
            raise ValueError("build_rollout_role: an engine that loads adapters from files needs adapter_dir")
        files = Path(adapter_dir)
    elif setup.lora is not None:
        adapter_bridge = bridge.with_tensors(adapter_tensors(bridge.shape, setup.lora))
    return RolloutRole(setup.mesh, builder.build(setup, bridge, started), bridge, sampling, setup.device,
                       turns=turns, adapter_bridge=adapter_bridge, adapter_dir=files, hf_dir=setup.hf_dir,
                       shares_actor_weights=get_engine(engine).traits.shares_actor_weights)


def resolve_builder(path: str) -> RolloutBuilder:
    """The `RolloutBuilder` an engine record names as "package.module:ATTRIBUTE"."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)
