"""megatron-core ``dist_checkpointing`` save/load of a model (and optionally its optimizer).

The checkpoint is TP x PP independent (every tensor is stored by its global shape and offsets), so one
saved at TP2 x PP2 loads at TP1, TP4, ... A checkpoint directory also holds the HF ``config.json`` it was
built from (``hf_config/``), so ``mcore-to-hf`` conversion and later loads need nothing else.

A model with LoRA adapters saves and loads its trained weights only (the adapters, and a scalar head), with its
optimizer's state, which covers nothing else: its frozen base never changes from the HF checkpoint it is built
from, which restores it bitwise.

Collective: call on every rank of the role. Scripts that save need an ``if __name__ == "__main__"`` guard
(dist_checkpointing starts a multiprocessing Manager).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.mapping import LocalNonpersistentObject, ShardedBase, ShardedObject
from megatron.core.dist_checkpointing.serialization import load_content_metadata
from megatron.core.dist_checkpointing.strategies import filesystem_async
from megatron.core.dist_checkpointing.utils import add_prefix_for_sharding
from megatron.core.optimizer.optimizer import param_group_identifier_keys

from megatron_adapters.lora import is_adapter_param
from megatron_adapters.model import load_hf_config

HF_CONFIG_DIR = "hf_config"
# Distributed-optimizer state stored so that it reloads at another DP size.
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}
# `save_models` checkpoints carry this in megatron's content metadata: each role's common state is then
# stored by the role's own first rank. Checkpoints without it kept every role's common state on rank 0.
ROLE_COMMON_FORMAT = {"hybridflow_role_common_state": 1}
# Param-group keys that megatron's scheduler sets from the config (peak and floor lr, weight decay). megatron
# matches saved param groups to the current ones by every identifier key, these included, so a resume with a
# new learning rate or weight decay found no group (KeyError). The saved groups take the current values.
SCHEDULED_GROUP_KEYS = ("max_lr", "min_lr", "start_wd", "end_wd")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel under DDP / Float16Module wrappers (or the model itself)."""
    while not hasattr(model, "pg_collection") and hasattr(model, "module"):
        model = model.module
    return model


def sharded_state(model, optimizer=None, is_loading: bool = False, prefix: str = "") -> dict:
    """{'model': ..., 'optimizer': ...} sharded state dicts of one role, for dist_checkpointing.

    `prefix` namespaces the checkpoint keys, so several models (actor, critic) share one checkpoint.
    """
    gpt = unwrap(model)
    metadata = {"dp_cp_group": gpt.pg_collection.dp_cp}
    entries = gpt.sharded_state_dict(prefix=prefix, metadata=metadata)
    trained = _adapted_trained_keys(gpt, prefix)
    state = {"model": {k: v for k, v in entries.items() if k in trained} if trained else entries}
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(
            state["model"], is_loading=is_loading, metadata={**metadata, **OPTIMIZER_METADATA}
        )
        if prefix:  # the optimizer names its shards after its buffers, not the model's prefixed keys
            add_prefix_for_sharding(state["optimizer"], prefix)
    return state


def _adapted_trained_keys(gpt, prefix: str = "") -> set[str]:
    """The state-dict keys of the weights a model with LoRA adapters trains (its adapters, a scalar head); empty
    for a model without adapters, which saves everything."""
    if not any(is_adapter_param(param) for param in gpt.parameters()):
        return set()
    return {prefix + name for name, param in gpt.named_parameters() if param.requires_grad}


def save_checkpoint(
    ckpt_dir: str | os.PathLike, model, hf_config, optimizer=None, extra: dict | None = None
) -> None:
    """Save ``model`` (+ ``optimizer``) as a dist checkpoint; ``extra`` (picklable, e.g. step) is kept."""
    path = Path(ckpt_dir)
    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
        load_hf_config(hf_config).save_pretrained(path / HF_CONFIG_DIR)
    dist.barrier()
    _prime_write_results_queue()
    state = sharded_state(model, optimizer)
    if extra:
        state["extra"] = extra
    dist_checkpointing.save(state, str(path))


def _prime_write_results_queue() -> None:
    """Start dist_checkpointing's per-process results Manager by fork instead of spawn when CUDA is unused.

    ``filesystem_async.get_write_results_queue`` defaults to a *spawned* Manager, which re-imports the
    entry point (torch + megatron: ~13 s per rank on a 2-core CPU box). A forked Manager only serves a
    queue and never touches CUDA, so where CUDA is not initialised forking it is safe and instant.
    """
    if filesystem_async._results_queue is None and not torch.cuda.is_initialized():
        filesystem_async.get_write_results_queue(mp_mode="fork")


def _role_replica_id(model) -> tuple[int, int, int]:
    """This rank's replica id within its role: (0, 0, 0) on the role's first rank only."""
    pgs = unwrap(model).pg_collection
    return pgs.tp.rank(), pgs.pp.rank(), pgs.dp_cp.rank()


def own_common_state(state, key_prefix: str, replica_id: tuple[int, ...]) -> None:
    """Wrap, in place, every common leaf of one role's sharded state dict in a `ShardedObject`.

    `dist_checkpointing.save` writes common leaves (anything that is not a ShardedBase or a
    LocalNonpersistentObject, e.g. the distributed optimizer's `param_state_sharding_type`) from global rank
    0 only, and `load` hands every rank rank 0's copy: a role that rank 0 does not hold would lose them.
    As a ShardedObject (keyed by the leaf's path, main replica on the role's first rank) the leaf is
    written by a rank of its own role and read back by every rank that asks for it. Call it with the same
    arguments on the state to save and on the state to load into.
    """
    # A hand walk, not dict_utils.dict_list_map_inplace / nested_items_iter: those do not give the leaf's
    # path, and the key must be the same on every rank of the role and between save and load.
    items = state.items() if isinstance(state, dict) else enumerate(state)
    for key, value in list(items):
        # "/" separates a ShardedObject's key from its shard suffix, so it may not appear in the key.
        path = f"{key_prefix}.{key}".replace("/", "_")
        if isinstance(value, (dict, list)):
            own_common_state(value, path, replica_id)
        elif not isinstance(value, (ShardedBase, LocalNonpersistentObject)):
            state[key] = ShardedObject(path, value, (1,), (0,), replica_id=replica_id)


def _role_states(models: dict[str, tuple], is_loading: bool, role_common: bool) -> dict:
    """Each role's sharded state, keys prefixed by role name; common leaves owned by the role if asked."""
    states = {}
    for name, (model, optimizer) in models.items():
        states[name] = sharded_state(model, optimizer, is_loading=is_loading, prefix=f"{name}.")
        if role_common:
            own_common_state(states[name], f"{name}.common", _role_replica_id(model))
    return states


def save_models(ckpt_dir: str | os.PathLike, models: dict[str, tuple]) -> None:
    """Save several models (name -> (model, optimizer or None)) into one dist checkpoint, keys prefixed by
    name. Collective over the world; a rank passes only the models it holds, and global rank 0 need hold
    none of them (each role's common state is written by the role's first rank)."""
    _prime_write_results_queue()
    state = _role_states(models, is_loading=False, role_common=True)
    dist_checkpointing.save(state, str(ckpt_dir), content_metadata=dict(ROLE_COMMON_FORMAT))


def _materialize_optimizer_state(optimizer) -> None:
    """Give a never-stepped optimizer the Adam state tensors (and step) that loading copies into.

    megatron's distributed optimizer reads the inner torch Adam's `step` while building the sharded state
    dict it loads into, and a fresh torch Adam has no state at all yet.
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        if opt.init_state_fn is not None:
            opt.init_state_fn(inner, opt.config)
        for group in inner.param_groups:
            for param in group["params"]:
                inner.state[param].setdefault("step", torch.tensor(0.0))


def load_models(ckpt_dir: str | os.PathLike, models: dict[str, tuple]) -> None:
    """Load what `save_models` wrote into this rank's models (at their own TP x PP). Collective.

    Checkpoints written before roles owned their common state (rank 0 then held every role) load too.
    """
    for _, optimizer in models.values():
        if optimizer is not None:
            _materialize_optimizer_state(optimizer)
    content = load_content_metadata(str(ckpt_dir)) or {}
    role_common = all(content.get(k) == v for k, v in ROLE_COMMON_FORMAT.items())
    state = _role_states(models, is_loading=True, role_common=role_common)
    with torch.no_grad():  # distributed-optimizer state copies into leaf tensors
        loaded = dist_checkpointing.load(state, str(ckpt_dir))
        for name, (model, optimizer) in models.items():
            weights = {k.removeprefix(f"{name}."): v for k, v in loaded[name]["model"].items()}
            _load_weights(unwrap(model), weights, ckpt_dir)
            if optimizer is not None:
                _load_optimizer_state(optimizer, loaded[name]["optimizer"])


def _load_optimizer_state(optimizer, state: dict) -> None:
    """`optimizer.load_state_dict`, then give every parameter its own, correct Adam `step`.

    On the torch-Adam path (no Apex/TE) megatron's distributed optimizer keeps the step count in its param
    groups and, on load, hands *one* step tensor to every parameter; loading the dp_reshardable shards then
    copies the stale pre-load step (0) into it. Adam would restart its bias correction and, the tensor
    being shared, advance it once per parameter each step. The checkpoint's step survives in the
    param groups that megatron loaded, so each parameter gets its own copy of that.
    """
    _adopt_current_schedule(optimizer, state)
    optimizer.load_state_dict(state)
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        for group in inner.param_groups:
            for param in group["params"]:
                if "step" in inner.state[param]:  # torch Adam only: Apex/TE Adam count steps per group
                    inner.state[param]["step"] = torch.tensor(float(group["step"]))


def _group_structure(group: dict) -> tuple:
    """A param group's identity without the scheduled keys (megatron's own lookup, NeMo's pre_ aliases too)."""
    return tuple(group.get(key, group.get(f"pre_{key}")) for key in param_group_identifier_keys
                 if key not in SCHEDULED_GROUP_KEYS)


def _adopt_current_schedule(optimizer, state) -> None:
    """Give each saved param group the current group's SCHEDULED_GROUP_KEYS, so that a resume may change the
    learning rate or weight decay (the scheduler, built with the config's values, sets them from then on)."""
    opts = getattr(optimizer, "chained_optimizers", [optimizer])
    states = [state] if len(opts) == 1 else [v for _, v in sorted(state.items())] if isinstance(state, dict) \
        else list(state)
    for opt, saved in zip(opts, states, strict=True):
        current = {_group_structure(g): g for g in opt.optimizer.param_groups}
        for group in saved.get("optimizer", saved)["param_groups"]:
            match = current.get(_group_structure(group))
            if match is None:  # megatron names the group it misses
                continue
            for key in SCHEDULED_GROUP_KEYS:  # absent, the scheduler reads its own value (None would break it)
                if key in match:
                    group[key] = match[key]
                else:
                    group.pop(key, None)


def _load_weights(gpt, weights: dict, ckpt_dir) -> None:
    # strict=False only for megatron's empty `_extra_state` entries and an adapted model's frozen base (not
    # saved); real parameters must all be there.
    result = gpt.load_state_dict(weights, strict=False)
    trained = _adapted_trained_keys(gpt)
    missing = [k for k in result.missing_keys
               if not k.endswith("_extra_state") and (not trained or k in trained)]
    if missing:
        raise ValueError(f"ckpt: {ckpt_dir} lacks parameters {missing}; was it saved from this model?")


def checkpoint_hf_config(ckpt_dir: str | os.PathLike):
    """The HF config a checkpoint was saved with (ValueError if the directory is not one of ours)."""
    config_dir = Path(ckpt_dir) / HF_CONFIG_DIR
    if not (config_dir / "config.json").exists():
        raise ValueError(
            f"ckpt: {ckpt_dir} has no {HF_CONFIG_DIR}/config.json; point it at a hybridflow checkpoint"
        )
    return load_hf_config(config_dir)


def load_checkpoint(ckpt_dir: str | os.PathLike, model, optimizer=None) -> dict:
    """Load a dist checkpoint into ``model`` (+ ``optimizer``) at the model's TP x PP; returns ``extra``."""
    if not Path(ckpt_dir, "metadata.json").exists():
        raise ValueError(f"ckpt: {ckpt_dir} is not a megatron dist checkpoint (no metadata.json)")
    state = sharded_state(model, optimizer, is_loading=True)
    with torch.no_grad():  # distributed-optimizer state copies into leaf tensors
        loaded = dist_checkpointing.load(state, str(ckpt_dir))
    _load_weights(unwrap(model), loaded["model"], ckpt_dir)
    if optimizer is not None:
        _load_optimizer_state(optimizer, loaded["optimizer"])
    return loaded.get("extra", {}) or {}
