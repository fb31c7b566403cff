"""Training-step and forward MFU of a megatron-core GPT built by ``megatron_adapters.model.build_gpt``.

    python benchmarks/actor_mfu.py                  # 1.5B Llama shape on one GPU, bf16 (the issue's setting)
    python benchmarks/actor_mfu.py --spec local     # megatron's unfused local attention, for comparison
    python benchmarks/actor_mfu.py --shape 8b --micro-batch 1               # Llama-3-8B shape
    python benchmarks/actor_mfu.py --shape 8b --mode forward --seq 1024     # a forward only (prefill, scoring)
    python benchmarks/actor_mfu.py --quick          # tiny model, runs on CPU too (smoke test)

`--mode train` times forward + backward (LM loss through megatron's vocab-parallel cross entropy) of one
micro-batch per step, no optimizer step; `--mode forward` times the same forward under no_grad (per-token
log-probs, what reference scoring and prefill do). TP = PP = 1. MFU = model FLOPs / step time / peak (989e12
for H200 dense bf16). Model FLOPs per token = 6 (forward: 2) * (matmul parameters incl. LM head, excl. the
input embedding) + 12 (forward: 4) * layers * seq * (heads * head_dim) (attention scores and values, full
square, PaLM's convention). `cost_model_mfu` is the same time in the auto planner's convention
(`ModelCostShape.forward_flops_per_token` at the causal mean context seq / 2, times 3 for training): the figure
that calibrates `Efficiency.train_mfu` / `infer_mfu` / `prefill_mfu`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hybridflow.launch.ports import free_port  # noqa: E402
from hybridflow.placement.auto.workload import ModelCostShape  # noqa: E402
from megatron_adapters.cpu_backend import enable_cpu_backend  # noqa: E402
from megatron_adapters.model import build_gpt  # noqa: E402
from megatron_adapters.process_groups import build_role_groups, seed_role_rng  # noqa: E402

H200_BF16_PEAK = 989e12
FULL = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
)
# Llama-3-8B: the size the planner's users start from.
LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
)
# Qwen2-7B's dimensions (a wider vocabulary, 7 query heads per KV head) in the Llama layout (no QKV bias):
# a third shape for fitting the decode-step figures.
QWEN2_7B = dict(
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
)
# SmolLM2-135M-Instruct's dimensions (its head is tied: TIED_SHAPES), the real model of issue #43's race.
SMOLLM2_135M = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
)
SHAPES = {"1.5b": FULL, "8b": LLAMA3_8B, "qwen7b": QWEN2_7B, "smollm2_135m": SMOLLM2_135M}
TIED_SHAPES = frozenset({"1.5b", "smollm2_135m"})  # the models these stand for share embedding and head
QUICK = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps (CPU smoke test)")
    parser.add_argument("--spec", default="auto", help="layer spec: auto | te | sdpa | local")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1.5b", help="model shape (default 1.5b)")
    parser.add_argument("--layers", type=int, default=None, help="override the shape's layer count")
    parser.add_argument("--mode", choices=("train", "forward"), default="train",
                        help="forward + backward (default) or a no-grad forward")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default 2048; quick 64)")
    parser.add_argument("--micro-batch", type=int, default=None, help="micro-batch size (default 4; quick 2)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 10; quick 2)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--peak-flops", type=float, default=H200_BF16_PEAK, help="peak FLOP/s for MFU")
    parser.add_argument("--json", default=None, help="also write the result as JSON here")
    return parser.parse_args(argv)


def cost_shape(cfg: LlamaConfig) -> ModelCostShape:
    """The planner's shape of `cfg`, whose FLOP formula both MFUs below use."""
    return ModelCostShape(cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
                          cfg.num_key_value_heads, cfg.vocab_size, tie_embeddings=cfg.tie_word_embeddings)


def model_flops_per_token(cfg: LlamaConfig, seq: int, passes: int = 3) -> float:
    """PaLM's convention (see the module docstring): attention over the full `seq`.

    `passes` = 3 for forward + backward, 1 for a forward."""
    return passes * cost_shape(cfg).forward_flops_per_token(seq)


def cost_model_flops_per_token(cfg: LlamaConfig, seq: int, passes: int = 3) -> float:
    """The auto planner's convention for the same token: the causal mean context seq / 2."""
    return passes * cost_shape(cfg).forward_flops_per_token(seq / 2)


def init_single_process() -> torch.device:
    """A one-rank world (nccl on GPU 0, else gloo + the CPU backend); returns the device to compute on.

    Its store listens on $MASTER_PORT, else on a port free now (a fixed one collides with any other run).
    """
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    if cuda:
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    enable_cpu_backend()
    return torch.device("cpu")


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = init_single_process()
    on_gpu = device.type == "cuda"
    seq = args.seq or (64 if args.quick else 2048)
    batch = args.micro_batch or (2 if args.quick else 4)
    steps = args.steps or (2 if args.quick else 10)
    shape = dict(QUICK if args.quick else SHAPES[args.shape])
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    train = args.mode == "train"
    passes = 3 if train else 1
    cfg = LlamaConfig(
        **shape,
        max_position_embeddings=seq,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
    )
    pg = build_role_groups([0], tp=1, pp=1, dp=1)
    seed_role_rng(1234, pg)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    model = build_gpt(cfg, pg, dtype=dtype, spec=args.spec)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    labels = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    position_ids = torch.arange(seq, device=device).expand(batch, seq)

    def step() -> None:
        if not train:
            with torch.no_grad():
                model(ids, position_ids, None, labels=labels)
            return
        loss = model(ids, position_ids, None, labels=labels).float().mean()
        loss.backward()
        for p in model.parameters():
            p.grad = None

    for _ in range(args.warmup):
        step()
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if on_gpu:
        torch.cuda.synchronize()
    step_s = (time.perf_counter() - start) / steps
    flops = model_flops_per_token(cfg, seq, passes) * batch * seq
    result = {
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "mode": args.mode,
        "spec": model.spec_name,
        "dtype": str(dtype).removeprefix("torch."),
        "layers": cfg.num_hidden_layers,
        "hidden": cfg.hidden_size,
        "vocab": cfg.vocab_size,
        "seq": seq,
        "micro_batch": batch,
        "steps": steps,
        "params": sum(p.numel() for p in model.parameters()),
        "step_s": step_s,
        "tflops_per_s": flops / step_s / 1e12,
        "mfu": flops / step_s / args.peak_flops,
        "cost_model_mfu": cost_model_flops_per_token(cfg, seq, passes) * batch * seq / step_s / args.peak_flops,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
    }
    print(
        f"mode={args.mode} spec={result['spec']} dtype={result['dtype']} params={result['params'] / 1e9:.2f}B "
        f"seq={seq} mb={batch}: step {step_s * 1e3:.1f} ms, {result['tflops_per_s']:.1f} TFLOP/s, "
        f"MFU {result['mfu'] * 100:.1f}% of {args.peak_flops / 1e12:.0f} TFLOP/s "
        f"(cost-model convention {result['cost_model_mfu'] * 100:.1f}%), "
        f"peak memory {result['peak_memory_gib'] or 0:.1f} GiB"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
