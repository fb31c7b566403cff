"""Rollout (generation) engine and sampling settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridflow.config.bounds import bounded
from hybridflow.config.model import DTYPES
from hybridflow.engines import AUTO, DEFAULT_ENGINE, engine_names
from hybridflow.tools import environment_names

SEED_MODES = ("per_batch", "per_request")
SLEEP_LEVELS = (1, 2)


@dataclass
class RolloutConfig:
    # A registered engine (hybridflow.engines: native megatron, the CPU default, or vllm), or auto: the planner
    # picks the one its cost model predicts faster for the plan (the plan carries the choice to the ranks).
    # The registry's names when the config is checked, so an engine registered by the user's own module counts.
    engine: str = bounded(DEFAULT_ENGINE, choices=lambda: (*engine_names(), AUTO))
    # Share of each GPU the engine may take for weights + KV cache (vLLM semantics). The native engine
    # sizes its KV cache for the batch instead and only uses this as an upper bound.
    gpu_memory_utilization: float = bounded(0.5, gt=0, le=1)
    max_new_tokens: int = bounded(32, ge=1)
    temperature: float = bounded(1.0, ge=0)  # 0 = greedy
    top_p: float = bounded(1.0, gt=0, le=1)
    top_k: int = bounded(0, ge=-1)  # 0 (or -1) = off
    n_samples_per_prompt: int = bounded(1, ge=1)
    # Token ids that end a response. None (the default) = the tokenizer's eos plus every `eos_token_id` of the
    # checkpoint's generation_config.json (Llama-3 instruct lists two); a list replaces that, [] = never stop.
    stop_token_ids: list[int] | None = bounded(None, ge=0)
    # vLLM engine arguments (`+rollout.engine_args.max_num_seqs=256`); hybridflow/engines/vllm_args.py lists the
    # keys, types and ranges it accepts and checks them when the experiment is loaded.
    engine_args: dict[str, Any] = field(default_factory=dict)
    # vLLM sleep between generations: 1 frees the KV cache and offloads weights, 2 also drops the weights.
    sleep_level: int = bounded(1, choices=SLEEP_LEVELS)
    dtype: str | None = bounded(None, choices=DTYPES)  # None = model.dtype
    # vLLM only. per_batch: requests carry no seed; vLLM samples from its engine-wide generator, seeded once per
    # engine at start (trainer.seed + the engine's DP rank): the fast path, but a resumed run does not repeat
    # the samples bit for bit. per_request: every row its own seed (trainer.seed, step, DP rank, row): resume is
    # bitwise, generation ~15% slower. The native engine draws each batch from one generator seeded by
    # (trainer.seed, step, DP rank), bitwise either way, and ignores this field.
    seed_mode: str = bounded("per_batch", choices=SEED_MODES)
    # Multi-turn rollouts (hybridflow.tools): a registered environment's name; None = single turn (one assistant
    # response per prompt). With one, max_new_tokens bounds each assistant turn, the whole trajectory (prompt,
    # turns, observations) fits data.seq_length, and chat prompts are required.
    environment: str | None = bounded(None, choices=environment_names)
    max_turns: int = bounded(4, ge=1)  # assistant turns per trajectory
    max_tool_tokens: int = bounded(256, ge=1)  # tokens of one tool response (longer ones lose their middle)
