"""Tiny random HF models and checkpoints (the tests' one factory) and a pipeline forward for parity tests.

`tiny_model(kind, seed, head, **overrides)` builds one in memory, `save_tiny_model` also writes it as an HF
checkpoint; `head="score"` is the sequence-classification (reward model) variant of the same decoder.

The parent test process builds the HF models (and their reference logits) before forking ranks; it
runs torch single-threaded first because an OpenMP pool created before `fork` hangs the children.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

# GQA Llama 3.1-style (llama3 rope scaling), untied; 8 query heads over 4 KV groups so TP4 works.
LLAMA = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=256,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_theta=500000.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    architectures=["LlamaForCausalLM"],
)
# Qwen2: qkv bias, tied embeddings, vocab 250 (divisible neither by TP 4 nor by 128).
QWEN2 = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=250,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    architectures=["Qwen2ForCausalLM"],
)
# Mistral with a sliding window shorter than the test sequence, so the window mask matters.
MISTRAL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=8,
    vocab_size=256,
    max_position_embeddings=64,
    sliding_window=5,
    tie_word_embeddings=False,
    architectures=["MistralForCausalLM"],
)
# Qwen3: per-head q/k RMSNorm and head_dim 16 != hidden 64 / 8 heads (q width 128 > hidden), tied embeddings.
QWEN3 = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=16,
    vocab_size=250,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    architectures=["Qwen3ForCausalLM"],
)
KINDS = {
    "llama": (LlamaConfig, LlamaForCausalLM, LLAMA),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, QWEN2),
    "mistral": (MistralConfig, MistralForCausalLM, MISTRAL),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, QWEN3),
}


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Weights far from init (norms around 1, everything else N(0, 0.1)) so mapping bugs show in logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else 0.1 * noise)


SCORE_HEADS = {"llama": LlamaForSequenceClassification}  # head="score": one scalar per sequence


def tiny_model(kind: str, seed: int = 0, head: str = "causal", **overrides):
    """A random tiny HF model of `kind` ("llama" | "qwen2" | "mistral" | "qwen3"), eval, fp32, weights from
    `randomize_(seed)`; `overrides` replace config fields. `head="score"`: the reward-model variant
    (sequence classification, one label, pad id 0)."""
    torch.set_num_threads(1)
    config_cls, model_cls, base = KINDS[kind]
    fields = {**base, **overrides}
    if head == "score":
        model_cls = SCORE_HEADS[kind]
        fields = {**fields, "architectures": [model_cls.__name__], "num_labels": 1, "pad_token_id": 0}
    model = model_cls(config_cls(**fields)).eval()
    randomize_(model, seed)
    return model


def save_tiny_model(kind: str, path, seed: int = 0, head: str = "causal", **overrides):
    """`tiny_model(...)` written to `path` as an HF checkpoint; returns the model."""
    model = tiny_model(kind, seed, head, **overrides)
    model.save_pretrained(path)
    return model


def token_batch(vocab_size: int, batch: int = 2, seq: int = 12, seed: int = 0) -> torch.Tensor:
    """Random token ids [batch, seq]."""
    return torch.randint(0, vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Reference logits from HF transformers."""
    torch.set_num_threads(1)
    return model(ids).logits.float()


def _global(group, index: int) -> int:
    return dist.get_global_rank(group, index)


@torch.no_grad()
def pipeline_forward(model, ids: torch.Tensor) -> torch.Tensor | None:
    """Forward through all PP stages by plain send/recv; on the last stage return the output
    gathered over TP (LM head: the padded vocab), elsewhere None.

    Runs on the model's device (the CPU under the CPU backend, the rank's GPU under nccl): `ids` are moved
    there and the activations are received into a buffer there (nccl sends and receives device tensors)."""
    pg = model.pg_collection
    pp_rank = pg.pp.rank()
    device = next(model.parameters()).device
    ids = ids.to(device)
    position_ids = torch.arange(ids.shape[1], device=device).expand_as(ids)
    if not model.pre_process:
        hidden = torch.empty(
            ids.shape[1], ids.shape[0], model.config.hidden_size, dtype=model.config.params_dtype, device=device
        )
        dist.recv(hidden, src=_global(pg.pp, pp_rank - 1))
        model.set_input_tensor(hidden)
    out = model(ids, position_ids, None)
    if not model.post_process:
        dist.send(out.contiguous(), dst=_global(pg.pp, pp_rank + 1))
        return None
    if model.head != "lm" or pg.tp.size() == 1:
        return out
    parts = [torch.empty_like(out) for _ in range(pg.tp.size())]
    dist.all_gather(parts, out.contiguous(), group=pg.tp)
    return torch.cat(parts, dim=-1)


# A real tokenizers-library tokenizer for checkpoints a user would bring: whitespace words, and two end tokens
# as Llama-3 instruct has them (the tokenizer's eos "<|eot|>" and "<|end|>", both in generation_config.json).
CHAT_WORDS = ["<pad>", "<s>", "<|end|>", "<|eot|>", "<unk>", *"0123456789", ">", "+", "="]


def save_tiny_checkpoint_with_tokenizer(path, generation_eos=(2, 3), seed: int = 0, **overrides):
    """`save_tiny_model("llama", ...)` plus a WordLevel tokenizer over `CHAT_WORDS` (eos "<|eot|>" = 3) and a
    generation_config.json whose `eos_token_id` is `generation_eos` (a list, or an int when one id)."""
    save_tiny_model("llama", path, seed, **overrides)
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(CHAT_WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="<|eot|>",
                            unk_token="<unk>").save_pretrained(str(path))
    eos = list(generation_eos) if len(generation_eos) > 1 else generation_eos[0]
    (Path(path) / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": eos}))
