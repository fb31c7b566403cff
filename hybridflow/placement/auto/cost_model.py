"""Predicted seconds per stage for one role under one strategy.

- Training and inference (preparation) are compute-bound: FLOPs / (GPUs * peak * MFU), stretched by the
  pipeline bubble, plus TP activation all-reduces, pipeline sends, and the DP gradient sync once per
  optimizer step (the part not hidden under backward). A micro-batch too small to be compute-bound costs
  at least the HBM traffic of its weight shard (roofline); 2048-token micro-batches are far above it.
- Generation on the device is memory-bound: every decode step streams the weight shard and the KV cache of
  the batch from HBM, plus per-layer latencies (TP all-reduces, kernel launches); prefill is compute-bound.
  The engine's record (hybridflow.engines, `decode_terms`) gives the share of HBM bandwidth the stream reaches,
  a launch term per layer and a host time per step: vLLM streams at `hbm_efficiency` plus an assumed launch
  term per layer; the native engine (graphs of megatron-core forwards, eager sampling) streams at its own rate
  plus a fixed time per step and a time per batch row and hidden unit, fitted on one H200 (engines/megatron.py
  NATIVE_DECODE). When a
  replica's batch does not fit the rollout's KV budget, it runs in waves.
  The bridge (training -> rollout layout, HybridFlow Table 2) and the rollout's sleep/wake weight copies
  to host memory are charged here.
- A role that offloads a share f of its optimizer (megatron's HybridDeviceOptimizer) pays, per optimizer
  step, that share's gradients down and parameters up over the host link (fp32 each way:
  OFFLOAD_LINK_BYTES_PER_PARAM) and torch's CPU Adam over it (`cpu_adam_s_per_param`, fitted to the measured
  ~2 s per update on the 1B H200 run, device.py CPU_ADAM); the GPU Adam runs on the rest only.
- vLLM's decode step adds a fixed host time (`vllm_decode_step_overhead_s`: scheduling, sampling, the
  engine process's round trip), fitted to the measured generation of the 1B H200 runs (engines/vllm.py VLLM_DECODE).
- A role with LoRA adapters (`RoleWork.adapter_params`) updates a frozen base: its forward and the
  activation-gradient backward, no weight-gradient GEMMs (2 of full training's 3 forwards' FLOPs) and no fp32
  main-grad traffic, plus the adapters' own 6 FLOPs per adapter weight and token; gradients, the DP sync and Adam
  cover the adapters only, and a rollout that holds the adapters is synced with their bytes only.
- Every pass of a role in a stage adds a fixed overhead (batch hand-off, barrier).
- A micro-batch costs at least a fixed host time per layer (forward; forward + backward), an optimizer step
  at least one per layer too: at 135M parameters that, not the math, is the time (device.py MICRO_BATCH_HOST).

Every time is a per-iteration figure for the whole role (its ranks work in lock-step). Each function has a
`*_breakdown` form (component -> seconds) that the explanation uses to say where time goes.
"""

from __future__ import annotations

import math

from hybridflow.config.parallel import micro_batch_split
from hybridflow.engines import get_engine
from hybridflow.placement.auto.comm import allreduce_time, bridge_time, p2p_time, tp_allreduce_time
from hybridflow.placement.auto.device import DeviceSpec, Efficiency
from hybridflow.placement.auto.strategy import Strategy
from hybridflow.placement.auto.workload import GENERATION, PREPARATION, TRAINING, RoleWork, Workload

# DP sync per optimizer step with Megatron's distributed optimizer: reduce-scatter of fp32 gradients
# (Megatron-LM accumulates and reduces bf16 models' gradients in fp32) then all-gather of bf16 parameters;
# as bytes per parameter of one all-reduce-equivalent (2 passes): (4 + 2) / 2.
DP_SYNC_BYTES_PER_PARAM = 3
# Adam update traffic per parameter of the optimizer shard (fp32 master, m, v, grad: read + write).
ADAM_BYTES_PER_PARAM = 32
# HBM bytes per parameter of the GPU's shard that one micro-batch moves whatever its size: a forward reads
# the bf16 weights; a backward reads them again (dgrad) and reads + writes the fp32 main grad that the
# weight-gradient GEMM accumulates into (megatron's gradient-accumulation fusion).
TRAIN_STREAM_BYTES_PER_PARAM = 2 + 2 + 8
# A frozen base (LoRA): the forward and the activation-gradient backward read the bf16 weights; no main grad.
FROZEN_STREAM_BYTES_PER_PARAM = 2 + 2
# Forward-equivalents of FLOPs per update over a frozen base: forward + activation-gradient backward, without
# the weight-gradient GEMMs (full training: 3).
FROZEN_BASE_FLOPS_FACTOR = 2.0
# Host link bytes per offloaded parameter per optimizer step: the fp32 gradient copied to the pinned host
# buffer, the updated fp32 master copied back into the GPU parameter (hybrid_optimizer.py, megatron-core 0.19).
OFFLOAD_LINK_BYTES_PER_PARAM = 4 + 4


Breakdown = dict[str, float]  # component -> seconds


def _pp_crosses_node(s: Strategy, device: DeviceSpec) -> bool:
    return s.tp * s.dp * s.pp > device.gpus_per_node


def _forward_passes(role: RoleWork, s: Strategy, workload: Workload, device: DeviceSpec, eff: Efficiency,
                    samples: int, batch_per_step: int, flops_factor: float, mfu: float,
                    allreduces_per_layer: int, max_rows: int, extra_flops_per_token: float = 0.0,
                    stream_bytes_per_param: float | None = None) -> Breakdown:
    """Compute, pipeline bubble, TP and PP communication of passes over `samples` full sequences, each
    schedule call over `batch_per_step` of them cut into micro-batches of at most `max_rows` rows per replica
    as the runtime cuts them (micro_batch_split). A micro-batch takes at least its host time per layer
    (`eff.forward_host_s_per_layer`, `train_host_s_per_layer`): a small model's kernels finish before
    the host has launched the next ones. `extra_flops_per_token` adds FLOPs outside the model's matmuls (LoRA
    adapters); `stream_bytes_per_param` replaces a training micro-batch's weight traffic (a frozen base)."""
    m, seq = role.model, workload.sequence_length
    flops = (flops_factor * m.forward_flops_per_token(seq / 2) + extra_flops_per_token) * samples * seq
    micro_per_step, rows = micro_batch_split(max(1, math.ceil(batch_per_step / s.dp)), max_rows)
    micro_batches = micro_per_step * samples / batch_per_step
    per_param = TRAIN_STREAM_BYTES_PER_PARAM if flops_factor > 1 else m.dtype_bytes
    per_param = per_param if stream_bytes_per_param is None else stream_bytes_per_param
    stream = micro_batches * m.params / (s.tp * s.pp) * per_param / (device.hbm_bytes_per_s * eff.hbm_efficiency)
    host_per_layer = eff.train_host_s_per_layer if flops_factor > 1 else eff.forward_host_s_per_layer
    host = micro_batches * m.num_layers / s.pp * host_per_layer
    compute = max(flops / (s.gpus * device.peak_flops * mfu), stream, host)
    # 1F1B: (p - 1) idle micro-batch slots per optimizer step (per pass for inference) of m micro-batches.
    bubble = compute * (s.pp - 1) / max(micro_per_step, 1.0)
    act_bytes = rows * seq * m.hidden_size * m.dtype_bytes
    tp = allreduces_per_layer * (m.num_layers / s.pp) * micro_batches * tp_allreduce_time(act_bytes, s.tp,
                                                                                           device, eff)
    sends = (2 if flops_factor > 1 else 1) * micro_batches * (s.pp - 1) / s.pp
    pp = sends * p2p_time(act_bytes / s.tp, _pp_crosses_node(s, device), device, eff) if s.pp > 1 else 0.0
    return {"compute": compute, "pipeline_bubble": bubble, "tp_comm": tp, "pp_comm": pp}


def training_breakdown(role: RoleWork, s: Strategy, workload: Workload, device: DeviceSpec,
                       eff: Efficiency) -> Breakdown:
    """PPO update: ppo_epochs passes over all samples, one optimizer step per mini-batch."""
    samples = workload.samples * workload.ppo_epochs
    # forward + backward = 3 forwards (2 over a frozen base, plus the adapters' forward and backward: 6 FLOPs per
    # adapter weight and token); 4 TP all-reduces per layer (2 forward, 2 backward).
    frozen = role.adapter_params > 0
    out = _forward_passes(role, s, workload, device, eff, samples, workload.mini_batch_size,
                          FROZEN_BASE_FLOPS_FACTOR if frozen else 3.0, eff.train_mfu, 4,
                          role.update_micro_batch_size or role.micro_batch_size,
                          extra_flops_per_token=6.0 * role.adapter_params,
                          stream_bytes_per_param=FROZEN_STREAM_BYTES_PER_PARAM if frozen else None)
    steps = samples / workload.mini_batch_size
    shard = role.trained_params / (s.tp * s.pp)  # what gets gradients, the DP sync and Adam
    sync = allreduce_time(shard * DP_SYNC_BYTES_PER_PARAM, s.dp, s.tp, device, eff) * (1 - eff.dp_overlap)
    on_host = shard / s.dp * role.offload_fraction
    adam = (shard / s.dp - on_host) * ADAM_BYTES_PER_PARAM / (device.hbm_bytes_per_s * eff.hbm_efficiency)
    adam = max(adam, role.model.num_layers / s.pp * eff.optimizer_host_s_per_layer)
    out = {**out, "dp_sync": steps * sync, "optimizer": steps * adam}
    if on_host and device.host_bytes_per_s > 0:  # a CPU "device" has no host link (nothing to copy)
        link = on_host * OFFLOAD_LINK_BYTES_PER_PARAM / (device.host_bytes_per_s * eff.host_link_efficiency)
        out["optimizer_offload"] = steps * (link + on_host * eff.cpu_adam_s_per_param)
    return out


def inference_breakdown(role: RoleWork, s: Strategy, workload: Workload, device: DeviceSpec,
                        eff: Efficiency) -> Breakdown:
    """Log-probs / values / rewards: one forward over every sample (`role.preparation_passes` of them)."""
    one = _forward_passes(role, s, workload, device, eff, workload.samples, workload.samples, 1.0,
                          eff.infer_mfu, 2, role.forward_micro_batch_size or role.micro_batch_size)
    return {part: seconds * role.preparation_passes for part, seconds in one.items()}


def generation_breakdown(role: RoleWork, s: Strategy, workload: Workload, device: DeviceSpec,
                         eff: Efficiency, kv_bytes: float) -> Breakdown:
    """Rollout at (gen_tp, gen_dp) with `kv_bytes` per GPU of KV cache, on the actor's GPUs (the bridge is
    charged here) or on its own at rollout_lag=1 (tp = gen_tp, pp 1: no in-place bridge; the split sync is
    charged per candidate, overlap.py).

    Every component is inf when not one sequence's KV cache fits.
    """
    m, g = role.model, s.gen_tp
    prompt, response, seq = workload.prompt_length, workload.response_length, workload.sequence_length
    batch = math.ceil(workload.samples / s.gen_dp)
    capacity = int(kv_bytes * g / (m.kv_bytes_per_token * seq))
    if capacity < 1:
        return {"decode_kv": math.inf}
    waves = math.ceil(batch / capacity)
    wave = math.ceil(batch / waves)
    # The engine's record gives its decode-step terms (hybridflow.engines: native and vLLM differ).
    terms = get_engine(workload.rollout_engine).decode_terms(eff, wave, m.hidden_size)
    hbm = device.hbm_bytes_per_s * terms.hbm_efficiency
    launch, host = terms.layer_launch_s, terms.step_host_s

    prefill = m.forward_flops_per_token(prompt / 2) * wave * prompt / (g * device.peak_flops * eff.prefill_mfu)
    prefill += 2 * m.num_layers * tp_allreduce_time(wave * prompt * m.hidden_size * m.dtype_bytes, g,
                                                   device, eff)
    # The step time is linear in the context, so `response` steps at the mean context sum exactly.
    context = prompt + response / 2
    weights = m.weight_bytes / g / hbm
    kv = wave * context * m.kv_bytes_per_token / g / hbm
    compute = wave * m.forward_flops_per_token(context) / (g * device.peak_flops * eff.infer_mfu)
    latency = m.num_layers * (2 * tp_allreduce_time(wave * m.hidden_size * m.dtype_bytes, g, device, eff)
                              + launch)
    steps = waves * response
    out = {"prefill": waves * prefill, "decode_latency": steps * latency,
           "bridge": bridge_time(role.synced_bytes, s.tp, s.pp, g, device, eff)}
    if workload.rollout_offloads_weights and device.host_bytes_per_s > 0:
        # Sleep after generating copies the shard to host memory, wake-up copies it back (then the bridge
        # overwrites it); every GPU copies its own shard at once.
        out["sleep_wake"] = 2 * m.weight_bytes / g / (device.host_bytes_per_s * eff.host_link_efficiency)
    # The native engine's fitted step (host = its fixed and per-row terms) already covers batches up to 256
    # rows; the compute roofline is a floor under it.
    if compute > weights + kv + host:
        out["decode_compute"] = steps * compute
    else:  # memory-bound: every step streams the weight shard and the batch's KV cache
        out.update(decode_weights=steps * weights, decode_kv=steps * kv)
        if host:
            out["decode_host"] = steps * host
    return out


def role_stage_breakdown(role: RoleWork, s: Strategy, workload: Workload, device: DeviceSpec,
                         eff: Efficiency, kv_bytes: float = 0.0) -> dict[str, Breakdown]:
    """Per stage `role` takes part in, its seconds by component (plus the fixed per-pass overhead)."""
    out: dict[str, Breakdown] = {}
    if GENERATION in role.stages:
        out[GENERATION] = generation_breakdown(role, s, workload, device, eff, kv_bytes)
    if PREPARATION in role.stages:
        out[PREPARATION] = inference_breakdown(role, s, workload, device, eff)
    if TRAINING in role.stages:
        out[TRAINING] = training_breakdown(role, s, workload, device, eff)
    return {stage: {**parts, "pass_overhead": eff.role_pass_overhead_s} for stage, parts in out.items()}


def role_stage_times(role: RoleWork, s: Strategy, workload: Workload, device: DeviceSpec, eff: Efficiency,
                     kv_bytes: float = 0.0) -> dict[str, float]:
    """Seconds `role` spends in each stage it takes part in."""
    return {stage: sum(parts.values())
            for stage, parts in role_stage_breakdown(role, s, workload, device, eff, kv_bytes).items()}
