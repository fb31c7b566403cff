"""The rollout engine interface: every engine (native Megatron, vLLM) answers `generate` the same way.

Sequences travel right-padded: row b holds its prompt at columns [0, prompt_len[b]) and its response side
right after it (one assistant segment today; assistant and observation turns in a multi-turn trajectory, see
hybridflow.token_kinds). Padding only ever sits at the end of a row, so causal attention needs no padding
mask and positions are plain 0..T-1 in every engine and in training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

import hybridflow.token_kinds as kinds

if TYPE_CHECKING:
    from hybridflow.config.rollout import RolloutConfig
    from hybridflow.placement import RoleMesh
    from megatron_adapters.bridge import TargetFormat, WeightBridge
    from megatron_adapters.lora import LoraSettings


@dataclass(frozen=True)
class SamplingParams:
    """What to sample. `top_k=0` and `top_p=1.0` switch those filters off. `logprobs=False` lets the engine
    skip the sampled tokens' log-probs (vLLM computes them at a cost; RolloutBatch.logprobs is then None)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    seed: int = 0
    logprobs: bool = True


@dataclass
class RolloutBatch:
    """Prompts in, responses out; every tensor is [B, T] with T = max prompt length + max_new_tokens.

    tokens:      prompt ids, then response-side ids, then pad_token_id
    prompt_lens: [B] number of prompt tokens in each row
    token_kinds: the TokenKind (hybridflow.token_kinds) of each column: PROMPT, ASSISTANT up to and including
                 the stop token, OBSERVATION, PAD after the end; None on a prompt-only batch. `seq_lens` and
                 `loss_mask` follow from it.
    logprobs:    at assistant columns, log p(token) under log_softmax(logits / temperature) of the model that
                 sampled it (no top-k/top-p renormalisation); 0 elsewhere. The actor recomputes the same
                 quantity and the parity gate compares the two. None when the sampling asked for none
                 (`SamplingParams.logprobs=False`).
    """

    tokens: torch.Tensor
    prompt_lens: torch.Tensor
    token_kinds: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None

    @property
    def seq_lens(self) -> torch.Tensor:
        """[B] prompt + response-side tokens of each row."""
        return kinds.sequence_lengths(self.token_kinds)

    @property
    def loss_mask(self) -> torch.Tensor:
        """[B, T] 1 on the tokens the engine sampled."""
        return kinds.loss_mask(self.token_kinds)


class RolloutEngine(Protocol):
    """One engine per rollout rank: inside the training process (native) or in a process of its own that the
    training rank feeds (vLLM, `hybridflow.rollout.engine_host`)."""

    def generate(self, batch: RolloutBatch, sampling: SamplingParams) -> RolloutBatch:
        """Fill tokens' response columns, token_kinds and logprobs for this DP rank's prompts."""
        ...

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        """The engine's own weight tensors by name, in its layout: the bridge writes into them in place."""
        ...

    def bucket_written(self, index: int) -> None:
        """The bridge finished bucket `index` of its program in `weight_tensors()` (an engine whose tensors are
        a staging buffer moves them on now; an engine written in place has nothing to do)."""
        ...

    def weights_written(self) -> None:
        """Called after the bridge wrote new weights (drop caches computed with the old ones)."""
        ...

    def sleep(self) -> None:
        """Hand memory back to training (KV cache, optionally weights)."""
        ...

    def wake_up(self, tags: tuple[str, ...] = ("weights", "kv_cache")) -> None:
        """Take memory again before sync / generation."""
        ...


@dataclass(frozen=True)
class EngineSetup:
    """What a rollout rank knows when it builds its engine (every rank builds; off the rollout `groups` is None).

    rollout: the experiment's rollout settings (engine-only fields such as sleep_level, engine_args);
    mesh: the rollout mesh in the bridge's generation order; groups: this rank's rollout process groups;
    hf_dir: the HF checkpoint that shapes the engine (its weights come from the bridge); seed: trainer.seed;
    lora: the actor's adapters when the engine takes them as adapters (the base once, then adapters only:
    `hybridflow.config.experiment.syncs_adapters`); None: it is given whole (merged) weights.
    """

    rollout: RolloutConfig
    mesh: RoleMesh
    groups: Any
    hf_dir: str
    dtype: torch.dtype
    device: torch.device
    seed: int
    timeout_s: float = 1800.0
    lora: LoraSettings | None = None


class RolloutBuilder(Protocol):
    """How an engine is built for a rollout rank: the object an engine record's `builder` path names
    (hybridflow.engines), resolved by hybridflow.roles.rollout_role only."""

    target: TargetFormat  # the weight layout the bridge writes into the engine
    staged: bool  # the engine lives in another process: the bridge writes a staging buffer
    # with EngineSetup.lora: the adapters reach the engine as a PEFT directory (its `load_adapter(path)`), not
    # through the bridge into its own adapter tensors
    adapters_from_files: bool

    def start(self, setup: EngineSetup) -> Any:
        """Begin what can run while the models build (an engine process's imports); what it returns goes to
        `build`. Called on every rank before any model is built; collective over the job."""
        ...

    def build(self, setup: EngineSetup, bridge: WeightBridge, started: Any) -> RolloutEngine | None:
        """This rank's engine (None off the rollout), from `start`'s result. Collective over the job, as the
        bridge is."""
        ...
