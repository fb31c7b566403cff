"""Hugging Face decoder configs -> megatron-core ``TransformerConfig`` + layer spec + ``GPTModel``.

Supported: the families registered in ``hybridflow.families`` (Llama 2/3/3.1 incl. llama3 rope scaling,
Qwen2/2.5 with qkv bias, Qwen3 with q/k norms and an explicit head_dim, Mistral with sliding-window
attention); each family's record says what differs (``shape.record``). Heads: ``"lm"`` (actor, reference:
the LM head over the padded, TP-split vocabulary), ``"value"`` (critic) and ``"reward"`` (reward model): one
scalar per token from a TP-replicated ``[1, hidden]`` weight, HF's ``*ForSequenceClassification.score``
layout.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from transformers import AutoConfig, PretrainedConfig

from hybridflow.families import VOCAB_DIVISIBLE_BY, ModelShape, padded_vocab_size, shape_from_hf
from megatron_adapters.lora import LoraSettings, freeze_base_weights
from megatron_adapters.packed_rotary import is_thd, per_token_rotary, with_host_offsets
from megatron_adapters.rotary_tables import RotaryTables, rotates_like_llama
from megatron_adapters.sdpa_attention import SdpaCoreAttention
from megatron_adapters.specs import HOST_OFFSET_SPECS, layer_spec, resolve_spec_name

HEADS = ("lm", "value", "reward")
PADDED_LOGIT = -1.0e30  # finite, so softmax/entropy over a fully padded TP shard stays NaN-free


def load_hf_config(hf_config: PretrainedConfig | dict | str | os.PathLike) -> PretrainedConfig:
    """Accept a ``PretrainedConfig``, a config.json dict, or a local model directory."""
    if isinstance(hf_config, PretrainedConfig):
        return hf_config
    if isinstance(hf_config, dict):
        data = dict(hf_config)
        return AutoConfig.for_model(data.pop("model_type"), **data)
    return AutoConfig.from_pretrained(os.fspath(hf_config), local_files_only=True)


def model_shape(hf_config) -> ModelShape:
    """The parallelism-independent shape of an HF model (validates the architecture; see
    ``hybridflow.families.shape_from_hf``, the planner's reading of the same config)."""
    return shape_from_hf(load_hf_config(hf_config))


@dataclass(frozen=True)
class RopeSettings:
    """Rotary embedding arguments for ``GPTModel``."""

    base: float
    llama3_scaling: bool = False
    factor: float = 8.0


def rope_settings(hf: PretrainedConfig) -> RopeSettings:
    """Read rope theta and scaling from either transformers-5 ``rope_parameters`` or older fields."""
    params = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    base = float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return RopeSettings(base=base)
    # megatron-core's llama3 scaling hard-codes low/high frequency factors 1/4 and an 8192 context.
    megatron_fixed = {
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    if rope_type == "llama3" and all(float(params.get(k, v)) == v for k, v in megatron_fixed.items()):
        return RopeSettings(base=base, llama3_scaling=True, factor=float(params.get("factor", 8.0)))
    raise ValueError(
        f"rope_parameters: rope_type {rope_type!r} with {params} is not supported; megatron-core supports "
        "'default' and 'llama3' with low_freq_factor=1, high_freq_factor=4, "
        "original_max_position_embeddings=8192"
    )


def transformer_config_from_hf(
    hf_config, tp: int = 1, pp: int = 1, dtype: torch.dtype = torch.float32, **overrides
) -> TransformerConfig:
    """Map an HF config to a megatron-core ``TransformerConfig`` (fused kernels off unless overridden)."""
    hf = load_hf_config(hf_config)
    shape = model_shape(hf)
    if shape.num_heads % tp or shape.num_kv_heads % tp:
        raise ValueError(
            f"tp: {tp} must divide num_attention_heads={shape.num_heads} and "
            f"num_key_value_heads={shape.num_kv_heads}; choose a tp that divides both"
        )
    if shape.num_layers % pp:
        raise ValueError(f"pp: {pp} must divide num_hidden_layers={shape.num_layers}; choose a divisor")
    window = getattr(hf, "sliding_window", None)
    uses_window = window is not None and (
        shape.record.sliding_window_always or getattr(hf, "use_sliding_window", False)
    )
    settings = dict(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads,
        kv_channels=shape.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=float(getattr(hf, "attention_dropout", 0.0)),
        init_method_std=float(getattr(hf, "initializer_range", 0.02)),
        window_size=(window - 1, 0) if uses_window else None,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        attention_softmax_in_fp32=True,
    )
    settings.update(overrides)
    if "use_cpu_initialization" not in settings:  # only now: callers that pass it never touch CUDA
        settings["use_cpu_initialization"] = not torch.cuda.is_available()
    return TransformerConfig(**settings)


class ScalarHead(MegatronModule):
    """One scalar per token (critic value / reward score) from a TP-replicated ``[1, hidden]`` weight.

    Called like ``GPTModel.output_layer``; every TP rank holds the full weight and sees the same hidden
    states, so its gradients agree across TP (with sequence parallelism the weight is marked like
    layernorm weights so megatron all-reduces its gradient).
    """

    def __init__(self, config: TransformerConfig, tp_group) -> None:
        super().__init__(config=config)
        self.tp_group = tp_group
        self.sequence_parallel = config.sequence_parallel
        device = None if config.use_cpu_initialization else torch.cuda.current_device()
        weight = torch.empty(1, config.hidden_size, dtype=config.params_dtype, device=device)
        if config.perform_initialization:
            # Used when the checkpoint has no `score` (a critic or reward model started from a causal LM).
            # N(0, 1/(hidden+1)), OpenRLHF's value-head init: the final RMSNorm output has entries of size
            # ~1, so the first values are ~N(0, 1/hidden), near zero as a fresh critic's should be; a zero
            # head would start at 0 too but pass the body no gradient until the head itself has moved.
            # Every TP rank draws the same numbers: the role's RNG is seeded identically there.
            torch.nn.init.normal_(weight, mean=0.0, std=1.0 / (config.hidden_size + 1))
        self.weight = torch.nn.Parameter(weight)
        self.weight.sequence_parallel = config.sequence_parallel

    def forward(self, hidden_states, weight=None, runtime_gather_output=None):
        """``[s, b, h]`` -> (``[s, b, 1]``, None), matching ColumnParallelLinear's return."""
        if self.sequence_parallel:
            hidden_states = gather_from_sequence_parallel_region(hidden_states, group=self.tp_group)
        return F.linear(hidden_states, self.weight), None


class HFGPTModel(GPTModel):
    """``GPTModel`` whose sharded state dict uses only the role's own process groups.

    megatron-core 0.19.2 ``LanguageModule.tie_embeddings_and_output_weights_state_dict`` (tied embeddings,
    last PP stage) reads the DP rank from the global ``parallel_state``, which explicit per-role groups
    never initialise; here it is answered from ``metadata["dp_cp_group"]`` for the duration of the call.
    """

    rotary_tables: RotaryTables | None = None  # set by `build_gpt` where the core attention rotates

    def tie_embeddings_and_output_weights_state_dict(
        self, sharded_state_dict, output_layer_weight_key, first_stage_word_emb_key, metadata=None
    ):
        metadata = metadata if metadata is not None else {"dp_cp_group": self.pg_collection.dp_cp}
        dp_cp = metadata["dp_cp_group"]
        with _patched(parallel_state, "get_data_parallel_rank", lambda *a, **k: dp_cp.rank()):
            return super().tie_embeddings_and_output_weights_state_dict(
                sharded_state_dict, output_layer_weight_key, first_stage_word_emb_key, metadata
            )

    def _one_pass_packed_rotary(self, packed_seq_params) -> bool:
        """Packed input, a spec that takes host offsets, and megatron's unfused RoPE (megatron_adapters.
        packed_rotary: one RoPE pass per layer instead of one per packed sequence)."""
        return (is_thd(packed_seq_params) and self.spec_name in HOST_OFFSET_SPECS
                and not self.config.apply_rope_fusion)

    def forward(self, *args, packed_seq_params=None, **kwargs):
        """GPTModel.forward; packed input gets host offsets for RoPE (see `_one_pass_packed_rotary`)."""
        if self._one_pass_packed_rotary(packed_seq_params):
            packed_seq_params = with_host_offsets(packed_seq_params)
        return super().forward(*args, packed_seq_params=packed_seq_params, **kwargs)

    def _preprocess(self, input_ids, position_ids, *args, packed_seq_params=None, **kwargs):
        """GPTModel._preprocess; for packed input the rotary table has one row per token (its position); for
        unpacked input with `rotary_tables`, megatron gets no angles and the core attention rotates."""
        out = super()._preprocess(input_ids, position_ids, *args, packed_seq_params=packed_seq_params, **kwargs)
        if out[1] is None:
            return out
        if self._one_pass_packed_rotary(packed_seq_params):
            return (out[0], per_token_rotary(out[1], position_ids), *out[2:])
        if self.rotary_tables is not None and packed_seq_params is None:
            self.rotary_tables.cover(out[1])
            return (out[0], None, *out[2:])
        return out


@contextlib.contextmanager
def _patched(owner, name: str, value):
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _embedding_output_requires_grad(model: GPTModel) -> None:
    """Megatron's recompute checkpoints (reentrant) pass gradients back only to inputs that require them. A frozen
    base's embedding output does not, so the adapters inside every recomputed layer got no gradient: a LoRA run
    with activation_recompute=full trained nothing, silently (grad norm 0). HF's enable_input_require_grads,
    for PEFT under gradient checkpointing, does the same."""

    def requires_grad(module, args, output):
        if torch.is_grad_enabled():
            output.requires_grad_(True)

    model.embedding.register_forward_hook(requires_grad)


def _mask_padded_vocab(model: GPTModel, vocab_size: int) -> None:
    """Make padded vocabulary columns of this rank's logit shard ~-inf, so softmax matches HF."""
    shard = model.output_layer.output_size_per_partition
    start = model.pg_collection.tp.rank() * shard
    first_pad = max(0, vocab_size - start)
    if first_pad >= shard:
        return

    def hook(_module, _inputs, output):
        logits, bias = output
        # In place: the matmul's backward does not need its output, and a copy of the logits is large.
        logits[..., first_pad:] = PADDED_LOGIT
        return logits, bias

    model.output_layer.register_forward_hook(hook)


def _rotate_in_core_attention(model: HFGPTModel, dtype: torch.dtype) -> None:
    """Give `model` and its SDPA core attentions one `RotaryTables` when they can rotate as megatron's unfused
    RoPE does (megatron_adapters.rotary_tables); otherwise leave megatron's RoPE in place."""
    cores = [m for m in model.modules() if isinstance(m, SdpaCoreAttention)]
    attentions = [m for m in model.modules() if hasattr(m, "_yarn_concentration_factor")]
    if (not cores or model.config.apply_rope_fusion or model.config.no_rope_freq  # NoPE layers skip RoPE
            or model.position_embedding_type != "rope"
            or not rotates_like_llama(model.rotary_pos_emb, model.config.kv_channels)
            or any(a._yarn_concentration_factor != 1.0 for a in attentions)):
        return
    model.rotary_tables = RotaryTables(dtype)
    for core in cores:
        core.rotary_tables = model.rotary_tables


def build_gpt(
    hf_config,
    pg_collection,
    head: str = "lm",
    dtype: torch.dtype = torch.float32,
    spec: str = "auto",
    make_vocab_size_divisible_by: int = VOCAB_DIVISIBLE_BY,
    lora: LoraSettings | None = None,
    **config_overrides,
) -> GPTModel:
    """Build this rank's stage of an HF decoder as a megatron-core ``GPTModel``.

    Args:
        hf_config: ``PretrainedConfig``, config.json dict, or local HF model directory.
        pg_collection: the role's ``ProcessGroupCollection`` (tp, pp, cp, embd, ... for this rank).
        head: "lm" (logits over this TP rank's padded vocab shard, padded columns ~-inf),
            "value" or "reward" (``[b, s, 1]``).
        dtype: parameter dtype (bf16 on GPU, fp32 on CPU tests).
        spec: layer spec name, see ``megatron_adapters.specs`` ("auto" | "te" | "sdpa" | "local").
        make_vocab_size_divisible_by: vocab padding unit (times TP), megatron's semantics.
        lora: LoRA adapters on ``lora.target_modules`` (chosen through the layer spec); every other weight
            but a scalar head's is frozen. None: no adapters.
        config_overrides: extra ``TransformerConfig`` fields (e.g. recompute settings).
    Returns:
        ``GPTModel`` with ``hf_shape`` (``ModelShape``), ``head``, ``spec_name`` and ``lora`` attributes.
    """
    if head not in HEADS:
        raise ValueError(f"head: {head!r} is not a head; use one of {', '.join(HEADS)}")
    hf = load_hf_config(hf_config)
    shape = model_shape(hf)
    tp, pp = pg_collection.tp.size(), pg_collection.pp.size()
    config = transformer_config_from_hf(hf, tp=tp, pp=pp, dtype=dtype, **config_overrides)
    rope = rope_settings(hf)
    pp_rank = pg_collection.pp.rank()

    spec_name = resolve_spec_name(spec)
    model = HFGPTModel(
        config=config,
        transformer_layer_spec=layer_spec(config, spec_name, lora),
        vocab_size=padded_vocab_size(shape.vocab_size, tp, make_vocab_size_divisible_by),
        max_sequence_length=hf.max_position_embeddings,
        pre_process=pp_rank == 0,
        post_process=pp_rank == pp - 1,
        parallel_output=True,
        share_embeddings_and_output_weights=shape.tie_word_embeddings and head == "lm",
        position_embedding_type="rope",
        rotary_base=rope.base,
        rope_scaling=rope.llama3_scaling,
        rope_scaling_factor=rope.factor,
        pg_collection=pg_collection,
    )
    if model.post_process:
        if head == "lm":
            _mask_padded_vocab(model, shape.vocab_size)
        else:
            model.output_layer = ScalarHead(config, pg_collection.tp)
    if dtype != torch.float32:
        # megatron builds torch norms in fp32 even with params_dtype=bf16 (its training loop's Float16Module
        # casts them later); cast here so inference-only roles run fused bf16 norms like trained ones.
        model.to(dtype=dtype)
    if not config.use_cpu_initialization:
        # megatron allocates TP layers on the GPU but plain torch modules (RMSNorm of the local spec) on
        # the CPU; megatron's own training loop moves the model afterwards, so do the same here.
        model.cuda(torch.cuda.current_device())
    _rotate_in_core_attention(model, dtype)
    if lora is not None:
        freeze_base_weights(model)
        if config.recompute_granularity is not None and model.pre_process:
            _embedding_output_requires_grad(model)
        if head != "lm" and model.post_process:
            # a scalar head usually starts untrained (a critic from a causal LM): it trains with the adapters,
            # as PEFT's modules_to_save does for a classifier
            model.output_layer.weight.requires_grad_(True)
    model.hf_shape = shape
    model.head = head
    model.spec_name = spec_name
    model.lora = lora
    return model
