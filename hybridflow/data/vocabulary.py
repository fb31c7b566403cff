"""The run's tokenizer as the planner sees it (before any file is written), the token ids that end a response,
and the checks that the policy's embedding covers both.

The planner printout, the run's preflight and the rollout engines all take their stop ids from
`stop_token_ids`, so what the plan says is what both engines (native and vLLM, through `SamplingParams`) stop on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from hybridflow.config import ExperimentConfig
from hybridflow.data.tasks import BUILTIN_ALPHABET, is_builtin
from hybridflow.data.tokenizer import DEFAULT_ALPHABET, char_tokenizer, load_tokenizer
from hybridflow.errors import UserError
from hybridflow.families import HF_CONFIG_FILE, read_hf_config


def char_alphabet(source: str) -> str:
    """The characters of the tokenizer a run without a tokenizer builds: the built-in tasks' few, else ASCII."""
    return BUILTIN_ALPHABET if is_builtin(source) else DEFAULT_ALPHABET


def tokenizer_source(cfg: ExperimentConfig) -> str:
    """Where the run's tokenizer comes from, in words (for messages and the plan printout)."""
    if cfg.data.tokenizer is not None:
        return f"data.tokenizer={cfg.data.tokenizer}"
    if cfg.model.path is not None:
        return f"model.path={cfg.model.path}"
    return "the built-in character tokenizer"


def run_tokenizer(cfg: ExperimentConfig) -> PreTrainedTokenizerBase:
    """The tokenizer the run will use: `data.tokenizer`, else `model.path`'s, else the character tokenizer the
    run writes into its output directory (built in memory here, so nothing is written)."""
    if cfg.data.tokenizer is not None:
        if not Path(cfg.data.tokenizer).is_dir():
            raise UserError(f"data.tokenizer: {cfg.data.tokenizer!r} is not a directory; point it at a local "
                            "HF tokenizer")
        return load_tokenizer(cfg.data.tokenizer)
    if cfg.model.path is not None:
        return load_tokenizer(cfg.model.path, field="model.path")
    return char_tokenizer(char_alphabet(cfg.data.source))


def checkpoint_eos_ids(model_dir: str | Path) -> tuple[int, ...]:
    """`eos_token_id` of the checkpoint's generation_config.json (an int or a list), else of its config.json:
    the ids HF `generate` stops on."""
    generation = Path(model_dir) / "generation_config.json"
    for path, read in ((generation, lambda: json.loads(generation.read_text())),
                       (Path(model_dir) / HF_CONFIG_FILE, lambda: read_hf_config(model_dir))):
        if not path.is_file():
            continue
        try:
            value = read().get("eos_token_id")
        except json.JSONDecodeError as err:
            raise UserError(f"model.path: {path} is not valid JSON ({err.msg}); fix or remove it") from None
        if value is not None:
            return tuple(value) if isinstance(value, list) else (int(value),)
    return ()


def stop_token_ids(cfg: ExperimentConfig, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """The ids that end a response: `rollout.stop_token_ids` when set (`[]` = never stop), else the tokenizer's
    eos and every eos id of the checkpoint at `model.path` (none without a checkpoint: a random model's config
    says nothing about the tokenizer)."""
    if cfg.rollout.stop_token_ids is not None:
        return tuple(cfg.rollout.stop_token_ids)
    ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    if cfg.model.path is not None:
        ids += checkpoint_eos_ids(cfg.model.path)
    return tuple(dict.fromkeys(ids))


def stop_ids_source(cfg: ExperimentConfig) -> str:
    """Where `stop_token_ids` took its ids from, in words."""
    if cfg.rollout.stop_token_ids is not None:
        return "rollout.stop_token_ids" + ("=[]" if not cfg.rollout.stop_token_ids else "")
    return "tokenizer eos" + (" + checkpoint eos_token_id" if cfg.model.path is not None else "")


@dataclass(frozen=True)
class RunTokens:
    """The tokenizer a run uses and the ids its responses stop at, checked against the policy's vocabulary."""

    tokenizer: PreTrainedTokenizerBase
    stop_token_ids: tuple[int, ...]


def check_run_tokens(cfg: ExperimentConfig) -> RunTokens:
    """`run_tokenizer` and `stop_token_ids`, refused (UserError) when the policy's embedding is smaller than the
    tokenizer (ids past it would have no embedding row) or a stop id lies outside it."""
    tokenizer = run_tokenizer(cfg)
    vocab, size = cfg.model.vocab_size, len(tokenizer)
    if size > vocab:
        fix = ("use a checkpoint whose embedding covers the tokenizer, or point data.tokenizer at the "
               "checkpoint's own tokenizer") if cfg.model.path else f"set model.vocab_size={size}"
        raise UserError(f"model.vocab_size: {vocab} is smaller than the tokenizer's {size} ids "
                        f"({tokenizer_source(cfg)}); {fix}")
    stops = stop_token_ids(cfg, tokenizer)
    outside = [i for i in stops if i >= vocab]
    if outside:
        raise UserError(f"rollout.stop_token_ids: {outside} (from {stop_ids_source(cfg)}) are not below "
                        f"model.vocab_size={vocab}; set rollout.stop_token_ids to ids of the model's vocabulary")
    return RunTokens(tokenizer, stops)
