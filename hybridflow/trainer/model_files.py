"""Where the run's HF checkpoint and tokenizer come from: local paths, or made locally for built-in tasks.

No model hub is involved. With `model.path` unset (the CPU default) rank 0 writes a small random HF
checkpoint of the configured shape and a character tokenizer (over the built-in tasks' 13 characters, or
printable ASCII) into the run directory, so every role loads
its weights through the same HF safetensors path a real checkpoint takes.

The critic and the reward model may name their own model (`critic_model`, `reward_model`): its `path` when
set, else a random checkpoint of its own shape; with no model of their own they start from the policy's.
Each stand-in records what it was made for (`STAND_IN_RECORD`) and is made again when that changes: a run
started over in its directory (`trainer.resume=never`) with another shape or seed trained the old stand-in.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import transformers

from hybridflow.config import ExperimentConfig, ModelConfig
from hybridflow.config.model import torch_dtype
from hybridflow.data import build_char_tokenizer
from hybridflow.data.vocabulary import char_alphabet
from hybridflow.role_records import model_roles, role_record


def random_hf_checkpoint(model: ModelConfig, out_dir: Path, seed: int, dtype: str | None = None) -> None:
    """Save a randomly initialised HF causal LM of `model`'s shape to `out_dir`, in `dtype` (default: the
    model's own, which every role loads it in: an 8B stand-in in fp32 held 30 GiB of host memory on rank 0 that
    the plan did not count; hybridflow.placement.host_memory counts this write)."""
    fields = dict(
        hidden_size=model.hidden_size, intermediate_size=model.intermediate_size,
        num_hidden_layers=model.num_hidden_layers, num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_key_value_heads, vocab_size=model.vocab_size,
        max_position_embeddings=model.max_position_embeddings, rope_theta=model.rope_theta,
        rms_norm_eps=model.rms_norm_eps, tie_word_embeddings=model.tie_word_embeddings,
        head_dim=model.attention_head_dim, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    # A sequence-classification architecture with no checkpoint: its body as a causal LM (the score head
    # is initialised when the role is built).
    family = model.family
    config = transformers.AutoConfig.for_model(family.model_type, architectures=[family.causal_lm], **fields)
    torch.manual_seed(seed)
    weights_dtype = torch_dtype(dtype or model.dtype)
    transformers.AutoModelForCausalLM.from_config(config, dtype=weights_dtype).save_pretrained(out_dir)


STAND_IN_RECORD = "hybridflow_stand_in.json"


def _made_for(out_dir: Path, inputs: dict) -> bool:
    """Whether `out_dir` holds a stand-in made from exactly `inputs`."""
    try:
        return json.loads((out_dir / STAND_IN_RECORD).read_text()) == inputs
    except (OSError, ValueError):
        return False


def _stand_in(out_dir: Path, inputs: dict, make: Callable[[Path], object]) -> None:
    """`make(out_dir)` unless `out_dir` already holds the stand-in of these `inputs` (JSON values)."""
    inputs = json.loads(json.dumps(inputs, default=str))
    if _made_for(out_dir, inputs):
        return
    shutil.rmtree(out_dir, ignore_errors=True)  # ours (a run directory's stand-in), made for other inputs
    make(out_dir)
    (out_dir / STAND_IN_RECORD).write_text(json.dumps(inputs))


def _random_model(model: ModelConfig, out_dir: Path, seed: int) -> None:
    _stand_in(out_dir, {"model": asdict(model), "seed": seed},
              lambda d: random_hf_checkpoint(model, d, seed))


def role_model_dirs(cfg: ExperimentConfig, work_dir: Path, hf_dir: str) -> dict[str, str]:
    """HF checkpoint dir per model role: the policy's `hf_dir` unless the role names its own model."""
    dirs = {role: hf_dir for role in model_roles()}
    for role in (r for r in dirs if role_record(r).own_model_field is not None):
        model = cfg.role_model(role)
        if model is not cfg.model:
            dirs[role] = model.path or str(work_dir / f"init_{role}_model")
    return dirs


def ensure_model_files(cfg: ExperimentConfig, work_dir: Path) -> tuple[str, str]:
    """(HF checkpoint dir, tokenizer dir), creating the local stand-ins on rank 0 when paths are unset
    (for the critic's and reward model's own shapes too, see `role_model_dirs`)."""
    hf_dir = Path(cfg.model.path) if cfg.model.path else work_dir / "init_model"
    tok_dir = Path(cfg.data.tokenizer) if cfg.data.tokenizer else (
        Path(cfg.model.path) if cfg.model.path else work_dir / "tokenizer")
    if dist.get_rank() == 0:
        if not cfg.model.path:
            _random_model(cfg.model, hf_dir, cfg.trainer.seed)
        for role, model_dir in role_model_dirs(cfg, work_dir, str(hf_dir)).items():
            model = cfg.role_model(role)
            if model is not cfg.model and not model.path:
                _random_model(model, Path(model_dir), cfg.trainer.seed)
        if not cfg.data.tokenizer and not cfg.model.path:
            # The preflight checked this tokenizer against model.vocab_size (data.vocabulary.check_run_tokens).
            alphabet = char_alphabet(cfg.data.source)
            _stand_in(tok_dir, {"alphabet": alphabet}, lambda d: build_char_tokenizer(d, alphabet))
    dist.barrier()
    return str(hf_dir), str(tok_dir)
