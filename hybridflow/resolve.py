"""Resolve once: the launching process composes the experiment and everything derived from it.

`resolve_experiment` is `load_experiment` plus what config alone must not do: a packaged model converted into
the cache and a layer cut made (transformers, GGUF, a file lock), both by `resolve_checkpoint`. The launcher
(`python -m hybridflow.run`, or the `--plan-only` step of a Slurm script) then plans and writes the resolved
config with the plan to plan.json (hybridflow.trainer.plan_file); ranks only read that file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hybridflow.config import ExperimentConfig, ModelConfig, load_experiment
from hybridflow.convert.packaged_model import first_layers, packaged_checkpoint
from hybridflow.errors import UserError


def resolve_checkpoint(model: ModelConfig, field: str) -> ModelConfig:
    """`model` with `packaged` and `keep_layers` turned into `path` (converted or cut once into the cache; a
    config resolved already passes through unchanged)."""
    keep = model.keep_layers
    if model.packaged is not None:
        source = packaged_checkpoint(model.packaged)
        resolved = first_layers(source, keep, field) if keep is not None else source
        if model.path is not None and Path(model.path) != resolved:
            raise UserError(f"{field}.path: set together with {field}.packaged={model.packaged}; set only one")
    elif model.path is None:
        raise UserError(f"{field}.keep_layers: needs a checkpoint ({field}.path or {field}.packaged); "
                        f"without one set {field}.num_hidden_layers")
    else:
        resolved = first_layers(Path(model.path), keep, field)
    return ModelConfig(**{**model.__dict__, "path": str(resolved)})


def resolve_experiment(experiment: str | None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """The experiment composed from conf/ with `overrides`, checkpoints resolved and every derived value filled
    (UserError naming the field for bad input)."""
    return load_experiment(experiment, overrides, checkpoints=resolve_checkpoint)
