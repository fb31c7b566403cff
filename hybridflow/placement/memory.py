"""Per-GPU memory estimate of one role (bytes), a pure function of model, layout and experiment.

Parts and the rules used (P = parameters held by the GPU: its pipeline stage's share, TP-sharded):
  weights      P x model dtype bytes. A rollout whose engine shares the actor's weights (its record's
               traits.shares_actor_weights: the native engine) on the actor's exact GPUs and layout reads the
               actor's tensors in place: 0.
  grads        P x 4 for trained roles (actor, critic): megatron keeps fp32 main grads for bf16 training.
               A role with LoRA adapters (`roles.<role>.lora`) holds its base weights once in the model dtype
               with no grads or optimizer state (frozen before megatron's DDP wrap): weights are (P + P_a) x
               dtype bytes and grads and optimizer count only the adapters' P_a (param_count.layer_lora_params).
               The reference of an actor with adapters is that actor's model with them off
               (config.parallel.reference_is_actor_base): weights 0, only its forward pass's activations.
  optimizer    Adam, distributed optimizer: (fp32 master copy 4 + two fp32 moments 8) = 12 bytes per
               parameter for bf16/fp16 models (8 for fp32 models, which need no master copy), sharded over
               DP; with `offload_optimizer` only the share not offloaded, (1 - offload_fraction) of it (the
               rest lives in host memory: host_memory.py). An unset fraction counts as 1.0 here (the least
               GPU memory); the planner replaces it with the share it picks (offload.py).
  activations  Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models")
               per-layer accounting, redone for Llama blocks (RMSNorm, GQA, SwiGLU, no dropout). Elements
               kept for backward per token per layer, h = hidden, h_q = heads x head_dim (= h unless the
               checkpoint sets head_dim), h_kv = kv_heads x head_dim, f = FFN size, a = heads, s = sequence length:
                 attention  h + 2h_q + 2h_kv + a*s   (QKV input, Q/K/V, softmax probs, out-proj input)
                 MLP        h + 4f                   (FC1 input, gate, up, silu(gate), down-proj input)
                 norms      2h                       (RMSNorm inputs)
               -> bytes/token/layer = dtype_bytes x (4h + 2h_q + 2h_kv + 4f + a*s). TP shards everything by t when
               sequence parallelism is on; without it the 4h of norm and block inputs stay whole.
               `selective` recompute (or flash attention) drops the a*s term; `full` keeps only the layer
               input (h) per layer plus one layer's full activations while it is recomputed.
               Training (1F1B): stage p holds min(pp - p, n_microbatches) micro-batches of its L/pp layers.
               The LM head's logits add N x V_padded / t x `logit_bytes` on the last stage (actor, ref), N the
               micro-batch's tokens, as megatron_adapters.logprobs.ChunkedLogprobs holds them: the model-dtype
               logits, in an update also their gradient and the copy the slice ModelRole.logprobs takes makes in
               backward (3 x dtype bytes), plus fp32 work tensors of one chunk (3 x CHUNK_TOKENS x V_padded / t x 4).
               Forward-only roles (ref, reward) keep one layer's activations plus the logits,
               for micro-batches of max(micro_batch_size, forward_max_tokens // seq_length) padded rows
               (`roles.<role>.forward_max_tokens`); trained roles take the larger of that forward pass
               (old log-probs, values) and their update.
               Micro-batch shape: N = rows x data.seq_length (padded rows), s = data.seq_length; an update
               (actor, critic, and the actor's warm-up) cuts the replica's mini_batch_size / dp rows into
               n_microbatches of at most max(micro_batch_size, update_max_tokens // seq_length) rows each
               (`roles.<role>.update_max_tokens`; config.parallel.micro_batch_split, the runtime's cut), rows
               = the largest of them (an unset budget counts as 0, micro_batch_size rows, the least memory; the
               planner replaces it with the budget it picks: update_budget.py); other roles: rows =
               micro_batch_size. With sequence packing
               (`roles.<role>.max_tokens_per_micro_batch` = B > 0; ref's unset value is the actor's) a
               micro-batch is one row of whole samples, each at most S = min(max_prompt_length +
               max_new_tokens, seq_length) tokens (seq_length with rollout.environment: a trajectory):
                 N = min(B, R x S) rounded up to a multiple of t under sequence parallelism (the runtime pads
                     it so), R = the replica's samples per schedule call (mini_batch_size / dp for training,
                     train_batch_size x n_samples_per_prompt / dp for a forward pass);
                 s = S: attention runs per sample (varlen kernels or a block-diagonal mask), so one query's
                     softmax spans at most its own sample, not the whole packed row;
                 n_microbatches = ceil(R / floor(B / S)): first-fit decreasing opens a micro-batch only when
                     every open one is too full for a sample, which leaves each holding >= floor(B / S)
                     samples; this bounds the runtime's count (the largest over DP replicas) for any lengths.
               The supervised warm-up (`trainer.warmup_sft_steps`) trains the actor on padded rows even when it
               packs (its tensors carry no sample lengths), so the actor then takes the larger of both shapes.
  kv_cache     rollout only, the engine record's `kv_cache_bytes` (hybridflow.engines) from what the batch
               needs, 2 (K,V) x L/pp x max(kv_heads/t, 1) x head_dim x dtype bytes per token, for
               (prompts x samples / DP) sequences of data.seq_length tokens. megatron: that;
               vllm: gpu_memory_utilization x capacity - weights (vLLM pre-allocates it).
Not counted: the copy of an adapted actor's base linears that a merged weight sync (or the merged HF export) keeps
while the merged weights are shipped (megatron_adapters.lora.adapters_merged; no activations are alive then),
CUDA contexts (the vLLM engine process has its own; 0.6 GiB on an H100), NCCL communicators (389 MiB each on an
H100 with NCCL 2.28, one per distinct rank list a rank is in: megatron_adapters.group_pool; on one GPU only the
default group's), the bridge's buckets (256 MiB; a vLLM
rank also keeps one bucket as the staging buffer it shares with its engine process), allocator
fragmentation: `cluster.gpu_memory_headroom_gib` keeps room for them, and the planner's checks and the auto
search compare estimates with the capacity less that headroom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Self

from hybridflow.config.experiment import ExperimentConfig, engine_of, longest_sample
from hybridflow.config.model import DTYPE_BYTES, ModelConfig
from hybridflow.config.parallel import RoleConfig, micro_batch_split, reference_is_actor_base
from hybridflow.families import padded_vocab_size
from hybridflow.placement.mesh import ParallelDims
from hybridflow.placement.param_count import layer_lora_params, layer_matmul_params
from hybridflow.role_records import Role, role_record
from hybridflow.units import GIB  # noqa: F401  (placement re-exports it)

GRAD_BYTES = 4  # fp32 main grads


class BytesByPart:
    """A frozen dataclass of byte counts per part: their total, part-wise sum, and JSON (GPU and host estimates)."""

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def __add__(self, other: Self) -> Self:
        return type(self)(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def to_json(self) -> dict[str, int]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "total": self.total}


@dataclass(frozen=True)
class MemoryEstimate(BytesByPart):
    weights: int = 0
    grads: int = 0
    optimizer: int = 0
    activations: int = 0
    kv_cache: int = 0


def padded_vocab(model: ModelConfig, tp: int) -> int:
    """The vocabulary megatron builds at `tp` (hybridflow.families.padded_vocab_size, megatron_adapters' rule)."""
    return padded_vocab_size(model.vocab_size, tp)


def layer_params(model: ModelConfig, tp: int) -> int:
    """Parameters of one transformer layer on one TP rank (norm weights are replicated)."""
    h, h_q, h_kv = model.hidden_size, model.q_dim, model.num_key_value_heads * model.attention_head_dim
    family = model.family
    bias = h_q + 2 * h_kv if family.qkv_bias else 0  # q, k, v biases, sharded with their weights
    qk_norms = 2 * model.attention_head_dim if family.qk_norm else 0  # one [head_dim] q and k norm, replicated
    return (layer_matmul_params(h, model.intermediate_size, h_kv, h_q) + bias) // tp + 2 * h + qk_norms


def stage_params(model: ModelConfig, role: str, tp: int, pp: int, stage: int) -> int:
    """Parameters held by one GPU of pipeline stage `stage` (embedding on the first, head on the last)."""
    h = model.hidden_size
    params = layer_params(model, tp) * (model.num_hidden_layers // pp)
    embedding = padded_vocab(model, tp) * h // tp
    if stage == 0:
        params += embedding
    if stage == pp - 1:
        params += h  # final norm
        if role_record(role).scalar_head:
            params += h  # scalar head, replicated
        elif not model.tie_word_embeddings or pp > 1:
            params += embedding  # untied head, or the tied copy megatron keeps on the last stage
    return params


def stage_adapter_params(model: ModelConfig, role_cfg: RoleConfig, tp: int, pp: int) -> int:
    """LoRA adapter parameters one GPU of any pipeline stage of a role holds (0 without `lora`)."""
    lora = role_cfg.lora
    if not lora.enabled:
        return 0
    h_kv = model.num_key_value_heads * model.attention_head_dim
    per_layer = layer_lora_params(model.hidden_size, model.intermediate_size, h_kv, model.q_dim, lora.rank,
                                  lora.target_modules, tp)
    return per_layer * (model.num_hidden_layers // pp)


def sequence_parallel(cfg: ExperimentConfig, role: str, tp: int) -> bool:
    """Whether a role's activations are split over TP: its setting at tp > 1, except for a model with LoRA
    adapters (the actor's, for a reference that is its base), which is built without Transformer Engine and so
    without sequence parallelism (hybridflow.roles.model_role.model_spec)."""
    adapted = cfg.roles.get(role).lora.enabled or (role == Role.REF and reference_is_actor_base(cfg.roles))
    return bool(cfg.roles.get(role).parallel.sequence_parallel) and tp > 1 and not adapted


def activation_bytes_per_token_layer(
    model: ModelConfig, seq_length: int, tp: int, sequence_parallel: bool, recompute: str
) -> float:
    """Bytes one token keeps for backward in one layer on one TP rank (see the module docstring)."""
    h, f, a = model.hidden_size, model.intermediate_size, model.num_attention_heads
    h_q, h_kv = model.q_dim, model.num_key_value_heads * model.attention_head_dim
    b = DTYPE_BYTES[model.dtype]
    if recompute == "full":
        return b * h / (tp if sequence_parallel else 1)
    sharded = 2 * h_q + 2 * h_kv + 4 * f + (a * seq_length if recompute == "none" else 0)
    whole = 4 * h
    if sequence_parallel or tp == 1:
        return b * (sharded + whole) / tp
    return b * (sharded / tp + whole)


@dataclass(frozen=True)
class MicroBatchShape:
    """One micro-batch of a model role as the memory model sees it: `rows` rows of `row_tokens` tokens whose
    queries attend over at most `attention_span` keys (the s of a*s), `count` of them per schedule call on a
    DP replica (training: per mini-batch). Packed micro-batches are one row (megatron's thd layout)."""

    rows: int
    row_tokens: int
    attention_span: int
    count: int

    @property
    def tokens(self) -> int:
        return self.rows * self.row_tokens


def token_budget(cfg: ExperimentConfig, role: str) -> int:
    """`roles.<role>.max_tokens_per_micro_batch` as the run uses it: 0 = no packing (ref's unset value was
    filled with the actor's by `load_experiment`)."""
    return cfg.roles.get(role).max_tokens_per_micro_batch or 0


def micro_batch_shape(
    cfg: ExperimentConfig, role: str, dp: int, pad_to: int = 1, packed: bool = True
) -> MicroBatchShape:
    """The largest micro-batch `role` runs at data-parallel size `dp` (module docstring, "Micro-batch shape").
    `pad_to`: packed micro-batches are padded to a multiple of it (tp under sequence parallelism);
    `packed=False` gives the padded shape even when the role packs (the actor's supervised warm-up)."""
    role_cfg = cfg.roles.get(role)
    seq, mbs = cfg.data.seq_length, role_cfg.micro_batch_size
    budget = token_budget(cfg, role) if packed else 0
    if not budget and role_record(role).trained:
        # the update's rows as ModelRole.micro_batches cuts this replica's share of a mini-batch
        count, rows = micro_batch_split(max(1, cfg.algorithm.mini_batch_size // dp),
                                        role_cfg.update_micro_batch_size(seq))
        return MicroBatchShape(rows=rows, row_tokens=seq, attention_span=seq, count=count)
    if not budget:
        return MicroBatchShape(rows=mbs, row_tokens=seq, attention_span=seq,
                               count=max(1, cfg.algorithm.mini_batch_size // (dp * mbs)))
    samples = (cfg.algorithm.mini_batch_size if role_record(role).trained
               else cfg.data.train_batch_size * cfg.rollout.n_samples_per_prompt)
    per_replica = max(1, math.ceil(samples / dp))
    longest = longest_sample(cfg)
    tokens = math.ceil(min(budget, per_replica * longest) / pad_to) * pad_to
    return MicroBatchShape(rows=1, row_tokens=tokens, attention_span=min(longest, budget),
                           count=math.ceil(per_replica / max(1, budget // longest)))


def estimate_role_memory(
    model: ModelConfig,
    role: str,
    dims: ParallelDims,
    cfg: ExperimentConfig,
    stage: int | None = None,
    shares_actor_weights: bool = False,
) -> MemoryEstimate:
    """Memory one GPU of `role` needs at layout `dims` (tp, pp, dp), on pipeline stage `stage`
    (None = the worst stage). Pure: reads only its arguments. `shares_actor_weights`: a native rollout
    colocated with the actor at the same layout (its weights cost nothing extra)."""
    tp, pp, dp = dims.tp, dims.pp, dims.dp
    if stage is None:
        return max(
            (estimate_role_memory(model, role, dims, cfg, s, shares_actor_weights) for s in range(pp)),
            key=lambda m: m.total,
        )
    role_cfg = cfg.roles.get(role)
    params = stage_params(model, role, tp, pp, stage)
    if role == Role.ROLLOUT:
        weights = 0 if shares_actor_weights else params * DTYPE_BYTES[cfg.rollout.dtype or model.dtype]
        return _rollout_memory(model, tp, pp, dp, cfg, weights)
    adapters = stage_adapter_params(model, role_cfg, tp, pp)
    base_shared = role == Role.REF and reference_is_actor_base(cfg.roles)  # the actor's model, adapters off
    weights = 0 if base_shared else (params + adapters) * DTYPE_BYTES[model.dtype]
    sp = sequence_parallel(cfg, role, tp)
    pad_to = tp if sp else 1
    activations = _activation_bytes(model, role, dims, cfg, stage, micro_batch_shape(cfg, role, dp, pad_to))
    if role == Role.ACTOR and cfg.trainer.warmup_sft_steps and token_budget(cfg, role):
        # The warm-up's padded micro-batches run on the same GPUs: the run needs room for the larger.
        padded = micro_batch_shape(cfg, role, dp, pad_to, packed=False)
        activations = max(activations, _activation_bytes(model, role, dims, cfg, stage, padded))
    if not role_record(role).trained:
        return MemoryEstimate(weights=weights, activations=activations)
    trained = stage_trained_params(model, role, role_cfg, tp, pp, stage)
    optimizer = math.ceil(optimizer_bytes(model, trained, dp) * (1 - offloaded_share(role_cfg)))
    return MemoryEstimate(weights=weights, grads=trained * GRAD_BYTES, optimizer=optimizer, activations=activations)


def stage_trained_params(model: ModelConfig, role: str, role_cfg: RoleConfig, tp: int, pp: int, stage: int) -> int:
    """The parameters one GPU of a trained role keeps grads and optimizer state for (and, with adapters,
    checkpoints): with LoRA its adapters, plus a scalar head on the last stage (it trains with them), the base
    being frozen; else all of its stage's parameters."""
    if not role_cfg.lora.enabled:
        return stage_params(model, role, tp, pp, stage)
    head = model.hidden_size if role_record(role).scalar_head and stage == pp - 1 else 0
    return stage_adapter_params(model, role_cfg, tp, pp) + head


def optimizer_bytes(model: ModelConfig, params: int, dp: int) -> float:
    """Adam's per-GPU state for `params` parameters, sharded over `dp`: fp32 master copy (bf16/fp16 models) and
    two fp32 moments."""
    master = 0 if model.dtype == "fp32" else 4
    return params * (master + 8) / dp


def offloaded_share(role_cfg: RoleConfig) -> float:
    """The share of a role's optimizer held in host memory: 0 without offload_optimizer; an unset
    offload_fraction (the planner's to pick) counts as 1.0."""
    if not role_cfg.offload_optimizer:
        return 0.0
    return 1.0 if role_cfg.offload_fraction is None else role_cfg.offload_fraction


# megatron_adapters.logprobs.CHUNK_TOKENS (tests/placement/test_memory.py ties them; placement imports no adapters)
LOGPROB_CHUNK_TOKENS = 1024


def logit_bytes(model: ModelConfig, tp: int, trained: bool) -> int:
    """Bytes one token's LM-head logits take on a TP rank while its log-probs are computed (module docstring),
    without the chunk's work tensors (`logit_chunk_bytes`, once per micro-batch)."""
    return padded_vocab(model, tp) // tp * DTYPE_BYTES[model.dtype] * (3 if trained else 1)


def logit_chunk_bytes(model: ModelConfig, tp: int) -> int:
    """The fp32 work tensors of one log-prob chunk on a TP rank (three [CHUNK_TOKENS, vocab shard] at once)."""
    return 3 * LOGPROB_CHUNK_TOKENS * (padded_vocab(model, tp) // tp) * 4


def _activation_bytes(
    model: ModelConfig, role: str, dims: ParallelDims, cfg: ExperimentConfig, stage: int, shape: MicroBatchShape
) -> int:
    """Activations (with the LM head's logits) of `role` on pipeline stage `stage` for micro-batches of `shape`."""
    tp, pp = dims.tp, dims.pp
    role_cfg = cfg.roles.get(role)
    sp = sequence_parallel(cfg, role, tp)
    # rows x row_tokens, in this order, keeps unpacked figures bit-identical to the mbs x seq form.
    seq, mbs = shape.row_tokens, shape.rows
    per_layer = activation_bytes_per_token_layer(model, shape.attention_span, tp, sp, role_cfg.activation_recompute)
    lm_head = role_record(role).head == "lm" and stage == pp - 1
    chunk = logit_chunk_bytes(model, tp)
    logits = seq * mbs * logit_bytes(model, tp, trained=True) + chunk if lm_head else 0
    # Forward-only passes (ref / old log-probs, values, rewards) of padded rows run
    # forward_micro_batch_size rows (`roles.<role>.forward_max_tokens`), at most the replica's samples of the step;
    # packed ones the packed shape.
    step_rows = math.ceil(cfg.data.train_batch_size * cfg.rollout.n_samples_per_prompt / dims.dp)
    fwd_rows = mbs if token_budget(cfg, role) else max(
        role_cfg.micro_batch_size, min(role_cfg.forward_micro_batch_size(cfg.data.seq_length), step_rows))
    fwd_logits = seq * fwd_rows * logit_bytes(model, tp, trained=False) + chunk if lm_head else 0
    if not role_record(role).trained:
        return int(per_layer * seq * fwd_rows) + fwd_logits
    full_layer = activation_bytes_per_token_layer(model, shape.attention_span, tp, sp, "selective")
    forward_only = int(full_layer * seq * fwd_rows) + fwd_logits  # no grad: nothing recomputed, one layer live
    in_flight = min(pp - stage, shape.count)
    activations = per_layer * seq * mbs * (model.num_hidden_layers // pp) * in_flight
    if role_cfg.activation_recompute == "full":
        activations += full_layer * seq * mbs  # the layer being recomputed
    return max(int(activations) + logits, forward_only)


def kv_bytes_per_token(model: ModelConfig, tp: int, pp: int, dtype: str) -> int:
    kv_heads = max(model.num_key_value_heads // tp, 1)
    return 2 * (model.num_hidden_layers // pp) * kv_heads * model.attention_head_dim * DTYPE_BYTES[dtype]


def _rollout_memory(
    model: ModelConfig, tp: int, pp: int, dp: int, cfg: ExperimentConfig, weights: int
) -> MemoryEstimate:
    """The rollout engine's weights and KV cache on one GPU: the engine's record sizes the cache from what
    this replica's batch needs at full length."""
    dtype = cfg.rollout.dtype or model.dtype
    sequences = math.ceil(cfg.data.train_batch_size * cfg.rollout.n_samples_per_prompt / dp)
    batch_kv = sequences * cfg.data.seq_length * kv_bytes_per_token(model, tp, pp, dtype)
    return MemoryEstimate(weights=weights, kv_cache=engine_of(cfg).kv_cache_bytes(
        cfg.rollout.gpu_memory_utilization, cfg.cluster.gpu_memory_gib, weights, batch_kv))


def rollout_shares_actor_weights(cfg: ExperimentConfig, colocated: bool, actor_tp: int, actor_pp: int,
                                 rollout_tp: int) -> bool:
    """A rollout whose engine reads the actor's weights in place (its record's `shares_actor_weights`):
    colocated with the actor, at its TP with PP 1 (the rollout generates at PP 1), in the model's dtype."""
    return (engine_of(cfg).traits.shares_actor_weights and colocated and actor_pp == 1 and actor_tp == rollout_tp
            and (cfg.rollout.dtype or cfg.model.dtype) == cfg.model.dtype)
