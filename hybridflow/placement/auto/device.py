"""Device figures and achievable-rate factors the cost model runs on.

Peak figures come from the cluster config (`hybridflow.config.cluster.GPU_DEFAULTS` fills A100/H100/H200
datasheet values); the `Efficiency` factors turn peaks into achievable rates. `Efficiency.sources` says per
figure whether it is assumed or measured; `Efficiency.calibrated(...)` / `load_calibration(path)` are the
hooks that replace a figure with a measured one and record where it came from (e.g. a benchmarks/results/
file). Measured so far (`MEASURED`, H200 only): HBM streaming, the native rollout's decode step
(`NATIVE_DECODE`) and vLLM's host time per decode step (`VLLM_DECODE`, both fitted figures of their engine's
record, hybridflow.engines), CPU Adam under optimizer offload
(`CPU_ADAM`), the per-pass overhead (`PASS_OVERHEAD`), the micro-batch host floors (`MICRO_BATCH_HOST`) and
training / forward / prefill MFU at the Llama-3-8B shape; every other figure (the communication figures,
vLLM's per-layer launch term) is an assumption.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from hybridflow.config.cluster import ClusterConfig, resolve_cluster
from hybridflow.engines.megatron import NATIVE_DECODE, NATIVE_DECODE_SOURCE
from hybridflow.engines.vllm import VLLM_DECODE, VLLM_DECODE_SOURCE
from hybridflow.errors import UserError
from hybridflow.units import GIB


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU type in one cluster shape. Bandwidths are bytes/s per GPU, one direction."""

    nodes: int
    gpus_per_node: int
    nvlink_domain: int  # GPUs that share NVLink; TP groups stay inside one
    memory_bytes: float
    peak_flops: float  # dense bf16
    hbm_bytes_per_s: float
    intra_bytes_per_s: float  # NVLink
    inter_bytes_per_s: float  # network between nodes
    host_bytes_per_s: float = 0.0  # PCIe to host memory; 0 = a CPU "device" (nothing to copy)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @classmethod
    def from_cluster(cls, cluster: ClusterConfig) -> DeviceSpec:
        c = resolve_cluster(cluster)
        return cls(nodes=c.nodes, gpus_per_node=c.gpus_per_node, nvlink_domain=c.nvlink_domain_size,
                   memory_bytes=c.gpu_memory_gib * GIB, peak_flops=c.bf16_tflops * 1e12,
                   hbm_bytes_per_s=c.hbm_tbps * 1e12, intra_bytes_per_s=c.intra_node_gbps * 1e9,
                   inter_bytes_per_s=c.inter_node_gbps * 1e9,
                   host_bytes_per_s=HOST_LINK_BYTES_PER_S.get(c.gpu_type, 0.0))


# PCIe link between one GPU and host memory, one direction (datasheets, SXM parts: A100 "PCIe Gen4 64 GB/s",
# H100 and H200 "PCIe Gen5 128 GB/s", both directions together). The cluster config has no field for it.
HOST_LINK_BYTES_PER_S: dict[str, float] = {"A100": 32e9, "H100": 64e9, "H200": 64e9}

_ASSUMED = "assumed (not calibrated)"

# torch's CPU Adam in HybridDeviceOptimizer, seconds per parameter per optimizer step, fitted together with the
# per-pass overhead (PASS_OVERHEAD) by benchmarks/fit_pass_overhead.py: the 1B H200 offload run
# (benchmarks/results/ppo_llama_1b_h200_offload_20261202/: update_actor 3.74, update_critic 3.02 s; 2 optimizer
# steps each on 1.236e9 parameters, all on the host) as levels and as differences to the same updates without
# offload (ppo_llama_1b_h200_20261203: 1.64 / 1.11 s), the host-link copies (8 bytes per parameter at
# 0.8 x 64 GB/s) modelled apart: 7.03e-10 (~1.4e9 parameters/s on that host's 16 cores, one rank; 6.55e-10 when
# fitted to the differences alone). Assumed per GPU elsewhere (8 ranks share a node's CPUs).
CPU_ADAM = {"cpu_adam_s_per_param": 7.03e-10}
_CPU_ADAM_SOURCE = ("fitted 2026-12-05 by benchmarks/fit_pass_overhead.py to the 1B offload run on one H200 "
                    "(benchmarks/results/ppo_llama_1b_h200_offload_20261202/) and its run without offload "
                    "(ppo_llama_1b_h200_20261203/)")
# Fixed time of one role's pass in one stage beyond its modelled compute and micro-batch host floors (batch
# broadcast from and results gathered to the collect rank, the barrier between stages, loss and metric
# reductions), fitted by benchmarks/fit_pass_overhead.py with CPU_ADAM to every measured H200 forward-only pass
# and update: the 1B PPO runs (ppo_llama_1b_h200_20261203, 7.72 s; its offload twin) and grpo_smollm2
# (smollm2_h200_20261204, 1.97 s). 0.21 s (was an assumed 0.5). One figure for every pass leaves structure
# behind: SmolLM2's forward passes (0.22 s measured, all micro-batch host time) come out 0.44 s, the 1B values
# pass +39 %, the 1B actor update -28 % (the LM head's fp32 logits over a 128k vocabulary are not modelled).
PASS_OVERHEAD = {"role_pass_overhead_s": 0.211}
_PASS_OVERHEAD_SOURCE = ("fitted 2026-12-05 by benchmarks/fit_pass_overhead.py to the forward-only passes and "
                         "updates of the 1B PPO H200 runs (with and without offload) and grpo_smollm2 on one H200 "
                         "(benchmarks/results/ppo_llama_1b_h200_20261203/, ppo_llama_1b_h200_offload_20261202/, "
                         "smollm2_h200_20261204/)")
# Forward + backward and forward-only MFU in the planner's FLOP convention (`ModelCostShape.forward_flops_per_token`
# at the causal mean context), Llama-3-8B shape, TP = PP = 1, megatron-core with torch SDPA (no Transformer
# Engine): benchmarks/actor_mfu.py --shape 8b [--mode forward]; at the 1.5B shape the same runs give 0.44 / 0.37.
_MFU_SOURCE = ("measured 2026-12-03 on one H200, Llama-3-8B shape, TP 1, torch SDPA: "
               "benchmarks/results/calibrate_h200_20261203/")


# Host time per micro-batch and layer, and per optimizer step and layer (Python in megatron-core's schedule and
# modules, kernel launches, host syncs), a floor under each micro-batch's compute. Measured 2026-12-04 on one
# H200 at SmolLM2-135M's shape (30 layers, bf16, commit b2bdae4; benchmarks/microbatch_overhead.py --shape
# smollm2_135m --rows 64 --micro-batch-sizes 4 64, benchmarks/results/smollm2_h200_20261204/overhead_smollm2.json):
# forward 59.5 / 56.5 ms per micro-batch of 4 / 64 rows, forward + backward 102.3 / 101.7 ms, optimizer step
# 19.1 / 17.1 ms, whatever the rows: 57 / 30, 101 / 30 and 18 / 30 ms per layer. One shape; per layer is the
# assumption that carries it to other depths. The per-pass overhead on top (PASS_OVERHEAD) is fitted with these
# floors in place.
MICRO_BATCH_HOST = {"forward_host_s_per_layer": 57e-3 / 30, "train_host_s_per_layer": 101e-3 / 30,
                    "optimizer_host_s_per_layer": 18e-3 / 30}
_MICRO_BATCH_HOST_SOURCE = ("measured 2026-12-04 on one H200, SmolLM2-135M shape, 30 layers "
                            "(benchmarks/results/smollm2_h200_20261204/overhead_smollm2.json, grpo_smollm2 stage "
                            "times)")


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak that real kernels reach, and fixed latencies. Each figure names its source."""

    train_mfu: float = 0.45  # Megatron-LM dense training on A100/H100 reaches 40-55 % MFU
    infer_mfu: float = 0.55  # a forward pass over full sequences (no backward, no optimizer)
    prefill_mfu: float = 0.45
    hbm_efficiency: float = 0.8  # share of HBM bandwidth a decode step streams at
    nvlink_efficiency: float = 0.7  # NCCL bus bandwidth / link bandwidth
    network_efficiency: float = 0.8
    # One GPU's pinned-memory copy over its PCIe x16 link; GPUs that share a switch uplink to the CPU
    # (two per switch on DGX A100) get less when they copy at the same time.
    host_link_efficiency: float = 0.8
    nvlink_latency_s: float = 10e-6  # per collective call, small message
    network_latency_s: float = 30e-6
    # vLLM (CUDA graphs): kernel launches per layer per decode step. Assumed: the measured vLLM runs fit only
    # the per-step term below (one shape cannot tell a per-layer from a per-step cost).
    decode_layer_overhead_s: float = 15e-6
    # vLLM's fixed host time per decode step on top of it (VLLM_DECODE; the H200 fit as the default).
    vllm_decode_step_overhead_s: float = VLLM_DECODE["vllm_decode_step_overhead_s"]
    # torch's CPU Adam (HybridDeviceOptimizer's host share) per parameter per optimizer step (CPU_ADAM).
    cpu_adam_s_per_param: float = CPU_ADAM["cpu_adam_s_per_param"]
    # The native rollout's decode step (see NATIVE_DECODE): bytes stream at this share of HBM peak, plus a
    # fixed time per step and a time per batch row and hidden unit.
    native_decode_hbm_efficiency: float = NATIVE_DECODE["native_decode_hbm_efficiency"]
    native_decode_step_overhead_s: float = NATIVE_DECODE["native_decode_step_overhead_s"]
    native_decode_s_per_row_hidden: float = NATIVE_DECODE["native_decode_s_per_row_hidden"]
    # Share of the data-parallel gradient sync hidden under backward compute (Megatron overlap_grad_reduce).
    dp_overlap: float = 0.0
    # Fixed cost of one role's pass in one stage, whatever the GPU count: batch broadcast from and results
    # gathered to the collect rank, the barrier between stages, switching the set's GPUs to this role
    # (PASS_OVERHEAD; the H200 fit as the default elsewhere).
    role_pass_overhead_s: float = PASS_OVERHEAD["role_pass_overhead_s"]
    # A micro-batch's host time per layer, forward-only and forward + backward, and an optimizer step's
    # (MICRO_BATCH_HOST; the H200 figures as the default elsewhere).
    forward_host_s_per_layer: float = MICRO_BATCH_HOST["forward_host_s_per_layer"]
    train_host_s_per_layer: float = MICRO_BATCH_HOST["train_host_s_per_layer"]
    optimizer_host_s_per_layer: float = MICRO_BATCH_HOST["optimizer_host_s_per_layer"]
    sources: dict[str, str] = field(default_factory=dict)

    def source(self, name: str) -> str:
        return self.sources.get(name, _ASSUMED)

    def calibrated(self, name: str, value: float, source: str) -> Efficiency:
        """This efficiency with `name` replaced by a measured `value`, recording `source`."""
        names = {f.name for f in fields(self)} - {"sources"}
        if name not in names:
            raise UserError(f"calibration: {name!r} is not a cost-model figure; use one of {sorted(names)}")
        return replace(self, **{name: value}, sources={**self.sources, name: source})

    def report(self) -> list[tuple[str, float, str]]:
        """(figure, value, source) for every figure: which are calibrated, which assumed."""
        names = [f.name for f in fields(self) if f.name != "sources"]
        return [(name, getattr(self, name), self.source(name)) for name in names]


# Figures measured on real hardware, per GPU type: (figure, value, source).
MEASURED: dict[str, list[tuple[str, float, str]]] = {
    "H200": [("hbm_efficiency", 0.85,
              "measured 2026-12-02 on one H200: bf16 [64 x 8192] @ [8192 x 28672] (a decode step's weight "
              "stream) reads 4.08 TB/s of the 4.8 TB/s datasheet (torch 2.11, cuBLAS)"),
             *[(name, value, NATIVE_DECODE_SOURCE) for name, value in NATIVE_DECODE.items()],
             *[(name, value, VLLM_DECODE_SOURCE) for name, value in VLLM_DECODE.items()],
             *[(name, value, _CPU_ADAM_SOURCE) for name, value in CPU_ADAM.items()],
             *[(name, value, _PASS_OVERHEAD_SOURCE) for name, value in PASS_OVERHEAD.items()],
             *[(name, value, _MICRO_BATCH_HOST_SOURCE) for name, value in MICRO_BATCH_HOST.items()],
             ("train_mfu", 0.535, _MFU_SOURCE + "train8b_mb1.json, train8b_mb2.json (0.535 / 0.541)"),
             ("infer_mfu", 0.519, _MFU_SOURCE + "fwd8b_s2048.json (sequence 2048, micro-batch 4)"),
             ("prefill_mfu", 0.518, _MFU_SOURCE + "fwd8b_s1024.json (1024-token prompts, batch 8)")],
}


def efficiency_for(gpu_type: str, base: Efficiency | None = None) -> Efficiency:
    """The default factors with the figures measured on `gpu_type` applied."""
    eff = base or Efficiency()
    for name, value, source in MEASURED.get(gpu_type, []):
        eff = eff.calibrated(name, value, source)
    return eff


def load_calibration(path: str | Path, base: Efficiency | None = None) -> Efficiency:
    """Apply measured figures from a JSON file `{"figures": {name: value}, "source": "..."}`.

    The benchmark harness writes such files under benchmarks/results/; none exists yet, so the default
    `Efficiency()` (all figures assumed) is what the planner uses today.
    """
    data = json.loads(Path(path).read_text())
    eff = base or Efficiency()
    for name, value in data.get("figures", {}).items():
        eff = eff.calibrated(name, float(value), data.get("source", str(path)))
    return eff
