"""Host (CPU) memory per node (bytes), a pure function of the role meshes and the experiment.

Parts, per rank, summed over a node's ranks (then the node's own share), all counted at once: a
conservative peak (the end-of-run checkpoint is written while the offloaded states still exist):
  processes    each training rank's process (Python, torch, the CUDA runtime's and NCCL's host state):
               TRAINING_PROCESS_GIB; a rollout engine's own process (its record's process_host_bytes: vLLM's
               hybridflow.engines.vllm.VLLM_ENGINE_PROCESS_GIB); the node's OS and launcher: NODE_SYSTEM_GIB.
               Round figures, not measured here.
  optimizer    megatron's HybridDeviceOptimizer (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py,
               megatron-core 0.19) on the offloaded share f of the rank's distributed-optimizer shard (P / dp
               parameters; a role with LoRA adapters: their P_a / dp, its base being frozen): a host fp32 copy
               of each offloaded parameter (`clone().cpu()` then `.float()`,
               param_update_in_fp32), torch Adam's exp_avg and exp_avg_sq on it (fp32), and the pinned fp32
               buffer its gradients are copied into (`cpu_copy_map_grad`, pin_cpu_grads):
               16 bytes x f x P / dp. The grad buffer is page-locked: the OS can never swap it out.
  rollout      the rank's rollout shard when its engine moves its weights to host memory while sleeping
               (the record's weights_on_host_while_sleeping: vLLM at `rollout.sleep_level=1`; level 2 and the
               native engine keep nothing there).
  checkpoint   the largest of the writes (they never overlap):
               - with no `model.path` (a random stand-in of the configured shape), global rank 0 first builds the
                 whole model in `model.dtype` in host memory and saves it (hybridflow.trainer.model_files; a
                 critic or reward model of its own shape with no path too, one after another);
               - the final HF export (`final_hf/`, always): TP rank 0 of each actor stage on DP replica 0
                 gathers the stage's full weights and safetensors' `save_file` serialises them in host memory;
               - after the last step (unless `trainer.save_last=false`) and every `trainer.save_every` steps,
                 megatron's dist_checkpointing, which stages every tensor it writes in host memory at once
                 (filesystem_async.preload_tensors: `tensor.to("cpu")`): each trained role's GPU-resident
                 optimizer share (offloaded states are written from where they live) and, on DP replica 0 (the
                 replica that writes them), its weights (a role with LoRA adapters: the adapters only).
  hf_load      loading HF safetensors reads each tensor's shard (memory-mapped, so the file's pages are cache
               the OS can drop): the largest one, the (padded) embedding shard, read and converted (x 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from hybridflow.config.experiment import ExperimentConfig, engine_of
from hybridflow.config.model import DTYPE_BYTES
from hybridflow.placement.cluster import GPU
from hybridflow.placement.memory import (
    GIB,
    BytesByPart,
    offloaded_share,
    optimizer_bytes,
    padded_vocab,
    stage_params,
    stage_trained_params,
)
from hybridflow.placement.mesh import RoleMesh
from hybridflow.role_records import Role, role_record

HOST_OPTIMIZER_BYTES_PER_PARAM = 16  # fp32 master 4 + Adam moments 8 + pinned fp32 grad copy 4
TRAINING_PROCESS_GIB = 3.0
NODE_SYSTEM_GIB = 4.0


@dataclass(frozen=True)
class HostMemoryEstimate(BytesByPart):
    processes: int = 0
    optimizer: int = 0
    rollout: int = 0
    checkpoint: int = 0
    hf_load: int = 0


def writes_dist_checkpoints(cfg: ExperimentConfig) -> bool:
    """Whether the run saves megatron dist checkpoints (trainer/loop.py: every save_every steps, and after the
    last unless save_last is false), whose staging is host memory."""
    return bool(cfg.trainer.save_every or cfg.trainer.save_last)


def offloaded_optimizer_bytes(cfg: ExperimentConfig, role: str, mesh: RoleMesh, stage: int) -> int:
    """Host bytes of one rank's offloaded optimizer share (module docstring, "optimizer")."""
    role_cfg, model = cfg.roles.get(role), cfg.role_model(role)
    params = stage_trained_params(model, role, role_cfg, mesh.tp, mesh.pp, stage)
    return math.ceil(HOST_OPTIMIZER_BYTES_PER_PARAM * offloaded_share(role_cfg) * params / mesh.dp)


def rank_host_memory(cfg: ExperimentConfig, meshes: Mapping[str, RoleMesh], rank: int) -> HostMemoryEstimate:
    """Host memory one rank's roles need (module docstring)."""
    processes, optimizer, rollout, hf_load = TRAINING_PROCESS_GIB * GIB, 0, 0, 0
    dist_ckpt, hf_export = 0, 0
    for role, mesh in meshes.items():
        if rank not in mesh.ranks:
            continue
        stage = mesh.coords(rank)[2]
        model = cfg.role_model(role)
        params = stage_params(model, role, mesh.tp, mesh.pp, stage)
        if role == Role.ROLLOUT:
            engine = engine_of(cfg)
            processes += engine.process_host_bytes()
            if engine.weights_on_host_while_sleeping(cfg.rollout.sleep_level):
                rollout += params * DTYPE_BYTES[cfg.rollout.dtype or model.dtype]
            continue
        if role_record(role).holds_model:
            embedding = padded_vocab(model, mesh.tp) * model.hidden_size // mesh.tp
            hf_load = max(hf_load, 2 * embedding * DTYPE_BYTES[model.dtype])
        if not role_record(role).trained:
            continue
        optimizer += offloaded_optimizer_bytes(cfg, role, mesh, stage)
        tp_rank, dp_rank, _ = mesh.coords(rank)
        # a role with LoRA adapters checkpoints them only (its base is the HF checkpoint it starts from)
        trained = stage_trained_params(model, role, cfg.roles.get(role), mesh.tp, mesh.pp, stage)
        weights = trained * DTYPE_BYTES[model.dtype] if dp_rank == 0 else 0
        if writes_dist_checkpoints(cfg):
            on_gpu = optimizer_bytes(model, trained, mesh.dp) * (1 - offloaded_share(cfg.roles.get(role)))
            dist_ckpt += weights + math.ceil(on_gpu)
        if role == Role.ACTOR and dp_rank == 0 and tp_rank == 0:
            hf_export = stage_params(model, role, 1, mesh.pp, stage) * DTYPE_BYTES[model.dtype]
    init = random_init_bytes(cfg, meshes) if rank == 0 else 0
    return HostMemoryEstimate(int(processes), optimizer, rollout, max(dist_ckpt, hf_export, init), hf_load)


def random_init_bytes(cfg: ExperimentConfig, roles: Mapping[str, RoleMesh]) -> int:
    """Host bytes of the largest random stand-in checkpoint global rank 0 builds for `roles` (a causal LM of
    each pathless model's shape, module docstring)."""
    models = [cfg.role_model(role) for role in roles if role_record(role).holds_model]
    return max((stage_params(m, Role.ACTOR, 1, 1, 0) * DTYPE_BYTES[m.dtype] for m in models if not m.path),
               default=0)


def node_host_memory(
    cfg: ExperimentConfig, meshes: Mapping[str, RoleMesh], gpus: tuple[GPU, ...]
) -> dict[int, HostMemoryEstimate]:
    """Node -> host memory of its ranks plus the node's own (NODE_SYSTEM_GIB, counted under processes)."""
    out = {node: HostMemoryEstimate(processes=int(NODE_SYSTEM_GIB * GIB)) for node in sorted({g.node for g in gpus})}
    for gpu in gpus:
        if any(gpu.rank in m.ranks for m in meshes.values()):
            out[gpu.node] = out[gpu.node] + rank_host_memory(cfg, meshes, gpu.rank)
    return out
