"""`rollout.engine_args`, checked when the experiment is loaded: vLLM itself only sees them on the GPU ranks,
minutes into a run.

The table lists the `vllm.EngineArgs` fields a rollout may tune, with the type and range vLLM accepts, taken
from the EngineArgs dataclass and its argument parser (vllm/engine/arg_utils.py) of vLLM 0.20, the oldest
release the engine supports; the fields named here keep their meaning in the later supported releases. A key
outside the table is refused with the table's names: add it here (with its type and range) when a rollout
needs it. Keys hybridflow's vLLM engine sets itself (`RESERVED`) are refused with the field that sets them.
A leaf: plain values in, `UserError` out; hybridflow.rollout.vllm_engine builds vLLM's arguments with the
same facts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridflow.errors import UserError

# Set by hybridflow's vLLM engine (hybridflow/rollout/vllm_engine.py: engine_kwargs), never by
# rollout.engine_args: they define how vLLM lives inside the job. Each names what sets it instead.
RESERVED: dict[str, str] = {
    "model": "the engine gets the actor's checkpoint (model.path)",
    "tensor_parallel_size": "set roles.rollout.parallel.tp",
    "pipeline_parallel_size": "the rollout runs at PP 1",
    "data_parallel_size": "the plan's rollout DP sets it",
    "distributed_executor_backend": "every rollout rank runs its own engine (external_launcher)",
    "enable_sleep_mode": "the engine sleeps between generations (set rollout.sleep_level)",
    "load_format": "weights come from the bridge",
    "dtype": "set rollout.dtype",
    "seed": "set trainer.seed (rollout.seed_mode chooses per-request seeds)",
    "enable_lora": "set roles.actor.lora.sync=adapters (with roles.actor.lora.rank)",
    "max_lora_rank": "roles.actor.lora.rank sets it",
    "max_loras": "the engine holds the actor's one adapter",
}


@dataclass(frozen=True)
class Arg:
    """One EngineArgs field: its kind ("int", "float", "bool", "str", "map", "int_or_map"), bounds, choices."""

    kind: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        """What a valid value is, in words ("an integer >= 1", "one of fcfs, priority")."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        words = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
                 "map": "a map {key: value}", "int_or_map": "an integer or a map"}[self.kind]
        limits = [f"{op} {v:g}" for op, v in ((">=", self.ge), (">", self.gt), ("<=", self.le)) if v is not None]
        return " ".join([words, " and ".join(limits)]).strip()


# vLLM 0.20 EngineArgs fields a rollout may set (see the module docstring).
KNOWN: dict[str, Arg] = {
    "max_num_seqs": Arg("int", ge=1),
    "max_num_batched_tokens": Arg("int", ge=1),
    "max_model_len": Arg("int", ge=1),
    "block_size": Arg("int", ge=1),
    "num_gpu_blocks_override": Arg("int", ge=1),
    "max_logprobs": Arg("int", ge=-1),  # -1: no cap
    "cpu_offload_gb": Arg("float", ge=0),
    "gpu_memory_utilization": Arg("float", gt=0, le=1),  # must equal rollout.gpu_memory_utilization
    "enforce_eager": Arg("bool"),
    "enable_prefix_caching": Arg("bool"),
    "enable_chunked_prefill": Arg("bool"),
    "disable_custom_all_reduce": Arg("bool"),
    "disable_log_stats": Arg("bool"),
    "skip_tokenizer_init": Arg("bool"),
    "kv_cache_dtype": Arg("str", choices=("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")),
    "scheduling_policy": Arg("str", choices=("fcfs", "priority")),
    "logprobs_mode": Arg("str", choices=("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")),
    "quantization": Arg("str"),
    "hf_overrides": Arg("map"),
    "compilation_config": Arg("int_or_map", ge=0, le=3),  # an optimisation level, or CompilationConfig fields
}


def _type_ok(value: Any, kind: str) -> bool:
    is_int = isinstance(value, int) and not isinstance(value, bool)  # true/false are not numbers here
    return {"int": is_int, "float": is_int or (isinstance(value, float) and math.isfinite(value)),
            "bool": isinstance(value, bool), "str": isinstance(value, str), "map": isinstance(value, Mapping),
            "int_or_map": is_int or isinstance(value, Mapping)}[kind]


def _in_range(value: Any, arg: Arg) -> bool:
    if isinstance(value, Mapping):
        return True
    if arg.choices:
        return value in arg.choices
    return not ((arg.ge is not None and value < arg.ge) or (arg.gt is not None and value <= arg.gt)
                or (arg.le is not None and value > arg.le))


def check_engine_args(engine_args: Mapping[str, Any], gpu_memory_utilization: float) -> None:
    """Refuse, in one line naming the key and the fix, a reserved or unknown key, a value of the wrong type or out
    of range, and a gpu_memory_utilization other than rollout.gpu_memory_utilization (the planner's figure)."""
    for key in sorted(engine_args):
        value, field = engine_args[key], f"rollout.engine_args.{key}"
        if key in RESERVED:
            raise UserError(f"{field}: set by hybridflow's vLLM engine ({RESERVED[key]}); remove it")
        arg = KNOWN.get(key)
        if arg is None:
            raise UserError(f"{field}: not a vLLM engine argument hybridflow knows; use one of "
                            f"{', '.join(sorted(KNOWN))} (hybridflow/engines/vllm_args.py lists them)")
        if not _type_ok(value, arg.kind) or not _in_range(value, arg):
            raise UserError(f"{field}: {value!r} is not valid; set {arg.describe()}")
    gmu = engine_args.get("gpu_memory_utilization", gpu_memory_utilization)
    if gmu != gpu_memory_utilization:
        raise UserError(f"rollout.engine_args.gpu_memory_utilization: {gmu} contradicts "
                        f"rollout.gpu_memory_utilization={gpu_memory_utilization}; set only "
                        "rollout.gpu_memory_utilization")
