"""vLLM rollout engine: one vLLM `LLM` per rollout rank, in the engine process that rank starts.

Works with vLLM 0.20 through 0.34 (`hybridflow.engines.vllm.VLLM_VERSIONS`; every version-dependent call
is in this module). Each engine process (`hybridflow.rollout.engine_host`) builds its `LLM` with
`distributed_executor_backend="external_launcher"`: vLLM reuses the engine processes' torch.distributed world
(and runs its V1 engine core in-process) and cuts it into TP groups of consecutive ranks
(vllm/distributed/parallel_state.py lays ranks out as ExternalDP x DP x PP x PCP x TP). The engine world is
the rollout mesh in the bridge's generation order, so those groups are the plan's. The engine starts with
random (`load_format="dummy"`) weights; the bridge's shards, already in vLLM's fused layout and already this
rank's TP slice, are copied straight into vLLM's parameter tensors (`weight_tensors`). vLLM is imported only
when an engine is built, so this module imports without it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hybridflow.config.model import DTYPES
from hybridflow.config.rollout import SEED_MODES, SLEEP_LEVELS, RolloutConfig
from hybridflow.engines.vllm_args import check_engine_args
from hybridflow.errors import UserError
from hybridflow.placement import RoleMesh
from hybridflow.rollout.base import EngineSetup, RolloutBatch, SamplingParams
from hybridflow.rollout.engine_host import EngineProcess, HostedEngine, build_hosted_engine, spawn_engine_process
from hybridflow.token_kinds import TokenKind, prompt_kinds
from megatron_adapters.bridge import TargetFormat, WeightBridge
from megatron_adapters.model import load_hf_config

# Defaults rollout.engine_args may override. processed_logprobs = log_softmax(logits / temperature), which is
# what RolloutBatch.logprobs promises as long as top-k/top-p are off (see `sampling_kwargs`).
DEFAULT_ENGINE_ARGS: dict[str, Any] = {"skip_tokenizer_init": True, "logprobs_mode": "processed_logprobs"}
SLEEP_TAGS = ("weights", "kv_cache")
# What the engine process imports while the models build (~27 s on the H200). `import vllm` alone is lazy: it
# loads about half the modules `from vllm import LLM` does (2.7k of 5.5k, vLLM 0.33 on CPU); the GPU worker,
# which `LLM(...)` imports next, adds 0.9k more. Both modules are there in vLLM 0.20.2 and 0.33.0 (checked).
VLLM_IMPORTS = ("vllm.entrypoints.llm", "vllm.v1.worker.gpu_worker")
PER_BATCH_NOTE = ("rollout: seed_mode=per_batch: vLLM samples from one generator per engine, so a resumed run "
                  "does not repeat its samples bit for bit; rollout.seed_mode=per_request does (~15% slower "
                  "generation)")


@dataclass(frozen=True)
class VllmEngineSpec:
    """What one rollout engine is built from; fields mirror RolloutConfig (its defaults too) plus the rollout
    mesh's TP.

    model_path: a local HF model directory (its config.json shapes the engine; weights come from the bridge).
    sleep_level: 1 frees the KV cache and offloads weights to CPU, 2 also discards the weights (cheaper when
    every sync rewrites all of them anyway).
    seed_mode: "per_request" gives every request its own seed (`request_seed`: reproducible samples, bitwise
    resume); "per_batch" sends none, so vLLM samples from its engine-wide generator (`engine_seed`), faster.
    """

    model_path: str
    tp: int
    dtype: str = "bf16"
    gpu_memory_utilization: float = RolloutConfig.gpu_memory_utilization
    sleep_level: int = RolloutConfig.sleep_level
    seed: int = 0
    seed_mode: str = RolloutConfig.seed_mode
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    lora_rank: int = 0  # the actor's adapters' rank when vLLM applies them itself (roles.actor.lora.sync=adapters)


def engine_kwargs(spec: VllmEngineSpec, known_args: Iterable[str] | None = None, dp_rank: int = 0) -> dict[str, Any]:
    """Keyword arguments for `vllm.LLM` on a rank of DP replica `dp_rank`; `known_args` (vllm.EngineArgs'
    fields) catches misspelled keys."""
    user = dict(spec.engine_args)
    check_engine_args(user, spec.gpu_memory_utilization)  # as at plan time: reserved, known, typed, in range
    for key in sorted(user):  # and against the installed vLLM, which may have dropped a field of the table
        if known_args is not None and key not in set(known_args):
            raise UserError(f"rollout.engine_args.{key}: not a vLLM engine argument of the installed vLLM; "
                            "remove it or see vllm.EngineArgs")
    user.pop("gpu_memory_utilization", None)
    if spec.dtype not in DTYPES:
        raise UserError(f"rollout.dtype: {spec.dtype!r} is not one of {sorted(DTYPES)}")
    if spec.sleep_level not in SLEEP_LEVELS:
        raise UserError(f"rollout.sleep_level: {spec.sleep_level} is not one of {SLEEP_LEVELS}")
    if spec.seed_mode not in SEED_MODES:
        raise UserError(f"rollout.seed_mode: {spec.seed_mode!r} is not one of {SEED_MODES}")
    lora = {}
    if spec.lora_rank:  # vLLM applies the actor's adapters itself (`VllmRolloutEngine.load_adapter`)
        lora = {"enable_lora": True, "max_lora_rank": vllm_lora_rank(spec.lora_rank), "max_loras": 1}
    return {
        **DEFAULT_ENGINE_ARGS,
        **user,
        **lora,
        "model": spec.model_path,
        "tensor_parallel_size": spec.tp,
        "distributed_executor_backend": "external_launcher",
        "enable_sleep_mode": True,
        "load_format": "dummy",
        "dtype": DTYPES[spec.dtype],  # vLLM takes the full names
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        # every TP rank runs its own scheduler and sampler; identical seeds keep them in lockstep
        "seed": engine_seed(spec.seed, dp_rank),
    }


# The adapter ranks vLLM's LoRA config accepts (its `max_lora_rank` choices, vLLM 0.20; not checked on a GPU).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """vLLM's `max_lora_rank` for adapters of `rank`: the smallest rank it accepts that holds them."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise UserError(f"roles.actor.lora.rank: {rank} exceeds vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}; "
                        "lower it or set roles.actor.lora.sync=merged")
    return fits[0]


def engine_seed(seed: int, dp_rank: int) -> int:
    """The engine-wide generator's seed: one per DP replica (its TP ranks must draw alike), so replicas do not
    draw the same noise for their different prompts when requests carry no seed (seed_mode=per_batch)."""
    return (seed + 1_000_003 * dp_rank) % (1 << 32)


def request_seed(seed: int, dp_rank: int, row: int) -> int:
    """A distinct, reproducible sampling seed per prompt row: duplicated prompts (GRPO groups) must differ."""
    return ((seed * 1_000_003 + dp_rank) * 1_000_003 + row) % (1 << 63)


def sampling_kwargs(sampling: SamplingParams, max_tokens: int, seed: int | None) -> dict[str, Any]:
    """Keyword arguments for one request's `vllm.SamplingParams`.

    Stopping happens only at `stop_token_ids` (ignore_eos), as in the native engine; logprobs=0 returns the
    sampled token's log-prob only, and is left out (no log-probs at all) unless `sampling.logprobs`. `seed`
    None sends no seed (the engine-wide generator samples). top_k <= 0 means off (RolloutConfig writes -1);
    vLLM 0.20-0.34 take 0.
    """
    if sampling.logprobs and (sampling.top_k > 0 or sampling.top_p < 1.0):
        warnings.warn(
            "vLLM returns log-probs renormalised after top-k/top-p filtering, while RolloutBatch.logprobs is "
            "unfiltered: the parity gate will show the difference",
            stacklevel=2,
        )
    kwargs: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else 0,
        "max_tokens": max_tokens,
        "stop_token_ids": list(sampling.stop_token_ids),
        "ignore_eos": True,
        "detokenize": False,
    }
    if sampling.logprobs:
        kwargs["logprobs"] = 0
    if seed is not None:
        kwargs["seed"] = seed
    return kwargs


def response_room(batch: RolloutBatch, sampling: SamplingParams) -> list[int]:
    """Tokens each row may generate: max_new_tokens, cut where the row's columns end (as native)."""
    width = batch.tokens.shape[1]
    return [min(sampling.max_new_tokens, width - int(p)) for p in batch.prompt_lens.tolist()]


def outputs_to_batch(batch: RolloutBatch, outputs: Sequence[Any | None], sampling: SamplingParams) -> RolloutBatch:
    """Write vLLM RequestOutputs (one per row, None for rows without room) into the batch's columns; the
    log-probs only if `sampling.logprobs` (else the batch's are None)."""
    tokens = batch.tokens.clone()
    bsz, width = tokens.shape
    logprobs = torch.zeros(bsz, width, dtype=torch.float32) if sampling.logprobs else None
    kinds = prompt_kinds(batch.prompt_lens.cpu(), width)
    if len(outputs) != bsz:
        raise RuntimeError(f"vLLM answered {len(outputs)} requests for {bsz} prompts")
    for row, (out, room) in enumerate(zip(outputs, response_room(batch, sampling), strict=True)):
        start = int(batch.prompt_lens[row])
        tokens[row, start:] = sampling.pad_token_id
        if out is None:
            continue
        if list(out.prompt_token_ids) != batch.tokens[row, :start].tolist():
            raise RuntimeError(f"vLLM output {row} belongs to another prompt (request order changed)")
        completion = out.outputs[0]
        ids = list(completion.token_ids)
        missing = logprobs is not None and (completion.logprobs is None or len(completion.logprobs) != len(ids))
        if len(ids) > room or missing:
            raise RuntimeError(f"vLLM output {row}: {len(ids)} tokens for room {room}, or log-probs missing")
        end = start + len(ids)
        tokens[row, start:end] = torch.tensor(ids, dtype=tokens.dtype)
        if logprobs is not None:
            # each position maps token id -> Logprob; with logprobs=0 it holds the sampled token (at least)
            picked = [pos[t].logprob for pos, t in zip(completion.logprobs, ids, strict=True)]
            logprobs[row, start:end] = torch.tensor(picked)
        kinds[row, start:end] = int(TokenKind.ASSISTANT)
    device = batch.tokens.device
    return RolloutBatch(tokens, batch.prompt_lens, kinds.to(device),
                        None if logprobs is None else logprobs.to(device))


class VllmRolloutEngine:
    """The RolloutEngine protocol on a vLLM `LLM` (built by `create`, or any object with its methods)."""

    def __init__(self, llm: Any, sampling_params_cls: Any, spec: VllmEngineSpec, dp_rank: int,
                 lora_request_cls: Any = None):
        self.llm = llm
        self.sampling_params_cls = sampling_params_cls
        self.spec = spec
        self.dp_rank = dp_rank
        self.asleep: set[str] = set()
        self.lora_request_cls = lora_request_cls  # vllm.lora.request.LoRARequest when spec.lora_rank
        self.lora_request: Any = None  # the adapter every request runs with (`load_adapter`)

    @classmethod
    def create(cls, spec: VllmEngineSpec, mesh: RoleMesh) -> VllmRolloutEngine:
        """Build this rank's engine; collective over the engine world, which must be `mesh` (0..n-1, TP
        fastest), as the engine host builds it: vLLM takes consecutive ranks of that world as TP groups."""
        import torch.distributed as dist

        world_size, rank = dist.get_world_size(), dist.get_rank()
        if mesh.ranks != tuple(range(world_size)) or mesh.pp != 1:
            raise RuntimeError(f"vLLM's world must be the rollout mesh 0..{world_size - 1} (PP 1), got {mesh}")
        import vllm

        known = [f.name for f in dataclasses.fields(vllm.EngineArgs)]
        dp_rank = mesh.coords(rank)[1]
        llm = vllm.LLM(**engine_kwargs(spec, known, dp_rank))
        if rank == 0 and spec.seed_mode == "per_batch":
            print(PER_BATCH_NOTE, file=sys.stderr, flush=True)
        lora_request_cls = None
        if spec.lora_rank:
            from vllm.lora.request import LoRARequest

            lora_request_cls = LoRARequest
        return cls(llm, vllm.SamplingParams, spec, dp_rank=dp_rank, lora_request_cls=lora_request_cls)

    def load_adapter(self, path: str) -> None:
        """Run every later request with the PEFT adapter in directory `path` (the actor's, just written). A new
        adapter id per call: vLLM caches an adapter's weights by id, so a reused id would keep the old ones; with
        max_loras=1 the previous one leaves the cache when this one is loaded (the first request loads it)."""
        if self.lora_request_cls is None:
            raise RuntimeError("vLLM engine was built without LoRA (VllmEngineSpec.lora_rank=0)")
        number = 1 if self.lora_request is None else self.lora_request.lora_int_id + 1
        self.lora_request = self.lora_request_cls(lora_name=f"actor-{number}", lora_int_id=number, lora_path=path)

    def model(self) -> torch.nn.Module:
        """vLLM's model on this rank. external_launcher runs one in-process worker, so `apply_model` (public
        since 0.9, same in 0.20-0.34) calls the function on the worker's model here and returns the module
        itself, not a copy; the internal attribute path to the worker differs between releases."""
        (model,) = self.llm.apply_model(lambda module: module)
        return model

    def generate(self, batch: RolloutBatch, sampling: SamplingParams) -> RolloutBatch:
        """Sample responses; every TP rank of this DP group must pass the same batch (lockstep)."""
        if self.asleep:
            raise RuntimeError(f"vLLM engine is asleep ({sorted(self.asleep)}): wake_up() before generate")
        rows, prompts, params = [], [], []
        for row, room in enumerate(response_room(batch, sampling)):
            if room <= 0:
                continue
            rows.append(row)
            prompts.append({"prompt_token_ids": batch.tokens[row, : int(batch.prompt_lens[row])].tolist()})
            seed = request_seed(sampling.seed, self.dp_rank, row) if self.spec.seed_mode == "per_request" else None
            params.append(self.sampling_params_cls(**sampling_kwargs(sampling, room, seed)))
        lora = {"lora_request": self.lora_request} if self.lora_request is not None else {}
        answers = self.llm.generate(prompts, params, use_tqdm=False, **lora) if prompts else []
        outputs: list[Any | None] = [None] * batch.tokens.shape[0]
        for row, answer in zip(rows, answers, strict=True):
            outputs[row] = answer
        return outputs_to_batch(batch, outputs, sampling)

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        """vLLM's parameters by name (one entry per tensor: a tied lm_head is the embedding). With LoRA on, vLLM
        wraps each adapted linear and keeps its weights under `base_layer`: they go by the plain name (the base
        the bridge writes), and its adapter slots (loaded from files) are left out."""
        if "weights" in self.asleep:
            raise RuntimeError("vLLM weights are asleep: wake_up(('weights',)) before writing them")
        params = self.model().named_parameters()
        return {name.replace(".base_layer.", "."): p.data for name, p in params if ".lora_" not in name}

    def bucket_written(self, index: int) -> None:
        """The engine host copies each bucket into `weight_tensors()` itself."""

    def weights_written(self) -> None:
        """Prefix-cache blocks hold KV computed with the old weights."""
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Free the KV cache (and offload or drop the weights, per spec.sleep_level) for training."""
        self.llm.sleep(level=self.spec.sleep_level)
        self.asleep = set(SLEEP_TAGS)

    def wake_up(self, tags: tuple[str, ...] = SLEEP_TAGS) -> None:
        """Re-allocate `tags` (weights before a sync, kv_cache before generation)."""
        unknown = set(tags) - set(SLEEP_TAGS)
        if unknown:
            raise ValueError(f"wake_up tags {sorted(unknown)} are not in {SLEEP_TAGS}")
        self.llm.wake_up(tags=list(tags))
        self.asleep -= set(tags)


def engine_spec(setup: EngineSetup) -> VllmEngineSpec:
    """The engine's spec from the experiment's rollout settings and the rollout mesh's TP."""
    r = setup.rollout
    dtype = next(name for name, attr in DTYPES.items() if getattr(torch, attr) == setup.dtype)
    return VllmEngineSpec(model_path=setup.hf_dir, tp=setup.mesh.tp, dtype=dtype,
                          gpu_memory_utilization=r.gpu_memory_utilization, sleep_level=r.sleep_level,
                          seed=setup.seed, seed_mode=r.seed_mode, engine_args=r.engine_args,
                          lora_rank=setup.lora.rank if setup.lora is not None else 0)


class VllmBuilder:
    """Starts an engine process per rollout rank (`engine_host`) before the models build, so `import vllm`
    overlaps with them, and builds vLLM's `LLM` in it afterwards; the bridge feeds it bucket by bucket through
    a staging buffer in vLLM's fused layout (hybridflow.engines.vllm's record names `BUILDER`)."""

    target = TargetFormat.VLLM
    staged = True
    adapters_from_files = True  # the actor's adapters reach vLLM as a PEFT directory (`load_adapter`)

    def start(self, setup: EngineSetup) -> EngineProcess | None:
        if not torch.cuda.is_available():  # the planner refuses vLLM on a cpu cluster; here, without CUDA
            raise UserError("rollout.engine: vllm runs on CUDA GPUs only and this machine has none visible "
                            "(torch.cuda.is_available() is False); set rollout.engine=megatron (or auto)")
        return spawn_engine_process(setup.mesh, setup.device, preload=VLLM_IMPORTS, timeout_s=setup.timeout_s,
                                    env_defaults=cache_env(),
                                    warm=functools.partial(warm_model_info, checkpoint_architectures(setup.hf_dir)))

    def build(self, setup: EngineSetup, bridge: WeightBridge, started: EngineProcess | None) -> HostedEngine | None:
        return build_hosted_engine(started, VllmRolloutEngine.create, (engine_spec(setup),), bridge.bucket_shapes(),
                                   setup.dtype)


def checkpoint_architectures(hf_dir: str) -> tuple[str, ...]:
    """`architectures` of the checkpoint's config (what vLLM resolves its model class from)."""
    return tuple(load_hf_config(hf_dir).architectures or ())


def warm_model_info(architectures: tuple[str, ...]) -> None:
    """Fill vLLM's model-info cache for `architectures` while the models build (run in the engine process by
    `spawn_engine_process`'s `warm`). On a cache miss (a fresh machine, or a new VLLM_CACHE_ROOT) `LLM(...)`
    inspects the model class in a new Python process that imports vLLM again (the H100 run's log shows 19 s of its
    54.5 s engine build between vLLM's argument line and "Resolved architecture", where that happens:
    benchmarks/results/race_h100_20261205/; the saving is not measured yet). Best effort: if this vLLM answers
    otherwise, the build does the inspection itself, as before."""
    from types import SimpleNamespace

    try:
        from vllm import ModelRegistry

        # The registry reads only these fields of a ModelConfig for an architecture it implements itself.
        ModelRegistry.inspect_model_cls(list(architectures), SimpleNamespace(
            model_impl="auto", convert_type="none", runner_type="generate"))
    except Exception as err:  # noqa: BLE001 - an optimisation: never fail the engine for it
        print(f"rollout: vLLM's model info was not inspected ahead ({type(err).__name__}: {err}); "
              "the engine build does it", file=sys.stderr)


def cache_env() -> dict[str, str]:
    """vLLM keeps its torch.compile and CUDA-graph caches in VLLM_CACHE_ROOT (default ~/.cache/vllm); with
    $HYBRIDFLOW_CACHE set (e.g. on a filesystem every node shares) they live under it, so later runs on any
    node start warm. An explicit VLLM_CACHE_ROOT wins."""
    root = os.environ.get("HYBRIDFLOW_CACHE")
    return {"VLLM_CACHE_ROOT": str(Path(root) / "vllm")} if root else {}


BUILDER = VllmBuilder()
