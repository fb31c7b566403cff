"""Native rollout decode throughput against the HBM-bandwidth roofline.

    python -m benchmarks.decode_roofline                        # Llama-3.2-1B shape, bf16, one GPU
    python -m benchmarks.decode_roofline --batches 64,256 --prompt 128 --new-tokens 512 --json out.json
    python -m benchmarks.decode_roofline --shape 8b --new-tokens 256  # Llama-3-8B shape (untied head)
    python -m benchmarks.decode_roofline --quick                # tiny model, CPU smoke test
    python -m benchmarks.decode_roofline --shape smollm2_135m --batches 256 --prompt 108 --new-tokens 160 \
        --sdpa-backends default,cudnn,efficient,math             # the race's decode, per attention kernel

Decode time = generate(N new tokens) - generate(1 new token) (prefill and the first sample cancel), so the
N - 1 decode steps are measured alone. The roofline of a decode step at context length c reads every weight
once and the KV cache of every row once: bytes(c) = weight_bytes + B * c * kv_bytes_per_token, with
kv_bytes_per_token = 2 (K, V) * layers * kv_heads * head_dim * dtype bytes. roofline seconds = sum over the
decode steps of bytes(c) / bandwidth, the bandwidth being one large device copy measured here (read + write).
Ratio = roofline seconds / measured seconds (1.0 = at the HBM roofline).

`--sdpa-backends` repeats every batch with PyTorch's SDPA restricted to one kernel (`torch.nn.attention.sdpa_kernel`)
around a fresh engine, so its CUDA graphs are captured with that kernel; "default" leaves the choice to PyTorch. A
kernel that cannot run the decode's masked attention gives a row with its error instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch
import torch.distributed as dist
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig

from benchmarks.actor_mfu import QUICK, SHAPES, TIED_SHAPES, init_single_process
from benchmarks.reshard import copy_bandwidth, sync_device
from hybridflow.errors import UserError, cli_errors
from hybridflow.rollout.base import RolloutBatch, SamplingParams
from hybridflow.rollout.megatron_engine import MegatronRolloutEngine
from megatron_adapters.model import build_gpt
from megatron_adapters.process_groups import build_role_groups, seed_role_rng


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, few tokens (CPU smoke test)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1.5b",
                        help="model shape (default 1.5b, with Llama-3.2-1B's tied head)")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (default 64,256)")
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens per row (default 128)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens sampled per row (default 512)")
    parser.add_argument("--repeats", type=int, default=2, help="timed generate pairs per batch (best kept)")
    parser.add_argument("--json", default=None, help="also write the result as JSON here")
    parser.add_argument("--profile", default=None, help="write a torch.profiler op table of one generate here")
    parser.add_argument("--sdpa-backends", default="default",
                        help=f"comma-separated SDPA kernels to time, of default,{','.join(SDPA_BACKENDS)}")
    return parser.parse_args(argv)


SDPA_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def sdpa_backend(name: str) -> contextlib.AbstractContextManager:
    """SDPA restricted to the kernel `name` ("default": PyTorch's own choice)."""
    if name == "default":
        return contextlib.nullcontext()
    if name not in SDPA_BACKENDS:
        raise UserError(f"--sdpa-backends: {name!r} is not a kernel; use default or one of {', '.join(SDPA_BACKENDS)}")
    return sdpa_kernel([SDPA_BACKENDS[name]])


def decode_roofline_seconds(weight_bytes: int, kv_bytes_per_token: int, batch: int, prompt: int,
                            new_tokens: int, bandwidth: float) -> float:
    """Seconds to stream weights + the KV cache once per decode step, for steps 2..new_tokens."""
    # Step j (1-based) attends over prompt + j - 1 cached tokens plus itself; step 1 is prefill's sample.
    contexts = sum(prompt + j for j in range(1, new_tokens))
    return ((new_tokens - 1) * weight_bytes + batch * contexts * kv_bytes_per_token) / bandwidth


def _timed_generate(engine, batch: RolloutBatch, new_tokens: int, device: torch.device) -> float:
    sampling = SamplingParams(max_new_tokens=new_tokens, seed=0)
    sync_device(device)
    start = time.perf_counter()
    engine.generate(batch, sampling)
    sync_device(device)
    return time.perf_counter() - start


def _profile(engine, batch: RolloutBatch, new_tokens: int, device: torch.device, path: str) -> None:
    """Where a decode step's time goes: ops by host time (launch overhead) and by device time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        _timed_generate(engine, batch, new_tokens, device)
    table = prof.key_averages()
    with open(path, "w") as f:
        f.write(table.table(sort_by="self_cpu_time_total", row_limit=40))
        if device.type == "cuda":
            f.write(table.table(sort_by="self_cuda_time_total", row_limit=25))


def main(argv=None) -> dict:
    args = parse_args(argv)
    backends = args.sdpa_backends.split(",")
    with cli_errors():
        for name in backends:
            sdpa_backend(name)  # refuses an unknown name before anything is built
    device = init_single_process()
    on_gpu = device.type == "cuda"
    batches = [int(b) for b in (args.batches or ("2" if args.quick else "64,256")).split(",")]
    prompt = args.prompt or (8 if args.quick else 128)
    new_tokens = args.new_tokens or (8 if args.quick else 512)
    dims = QUICK if args.quick else SHAPES[args.shape]
    cfg = LlamaConfig(**dims, max_position_embeddings=prompt + new_tokens, rope_theta=500000.0,
                      tie_word_embeddings=args.shape in TIED_SHAPES, architectures=["LlamaForCausalLM"])
    pg = build_role_groups([0], tp=1, pp=1, dp=1)
    seed_role_rng(1234, pg)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    model = build_gpt(cfg, pg, dtype=dtype, spec="decode")

    elem = torch.finfo(dtype).bits // 8
    weight_bytes = sum(p.numel() for p in model.parameters()) * elem
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_bytes_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * elem
    bandwidth = copy_bandwidth(device, 2**31 if on_gpu else 2**24)
    rows = []
    for bsz, backend in ((b, name) for b in batches for name in backends):
        ids = torch.randint(0, cfg.vocab_size, (bsz, prompt + new_tokens), device=device)
        batch = RolloutBatch(ids, torch.full((bsz,), prompt, dtype=torch.long))
        engine = MegatronRolloutEngine(model, pg.tp, cfg.vocab_size)  # fresh graphs, captured under `backend`
        try:
            with sdpa_backend(backend):
                _timed_generate(engine, batch, 2, device)  # warm-up: kernels, allocator
                full = min(_timed_generate(engine, batch, new_tokens, device) for _ in range(args.repeats))
                first = min(_timed_generate(engine, batch, 1, device) for _ in range(args.repeats))
        except RuntimeError as err:  # this kernel cannot run the decode's attention
            rows.append({"batch": bsz, "sdpa_backend": backend, "error": str(err).splitlines()[0][:200]})
            print(json.dumps(rows[-1]), flush=True)
            continue
        decode_s = full - first
        roof_s = decode_roofline_seconds(weight_bytes, kv_bytes_per_token, bsz, prompt, new_tokens, bandwidth)
        rows.append({
            "batch": bsz,
            "sdpa_backend": backend,
            "generate_s": full,
            "prefill_s": first,
            "decode_s": decode_s,
            "decode_ms_per_step": 1e3 * decode_s / (new_tokens - 1),
            "decode_tokens_per_s": bsz * (new_tokens - 1) / decode_s,
            "roofline_s": roof_s,
            "fraction_of_roofline": roof_s / decode_s,
        })
        print(json.dumps(rows[-1]), flush=True)
        if args.profile:
            with sdpa_backend(backend):
                _profile(engine, batch, min(new_tokens, 32), device, f"{args.profile}.b{bsz}.{backend}.txt")
    result = {
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "shape": "quick" if args.quick else args.shape,
        "params": weight_bytes // elem,
        "weight_bytes": weight_bytes,
        "kv_bytes_per_token": kv_bytes_per_token,
        "copy_bandwidth_tbps": bandwidth / 1e12,
        "prompt": prompt,
        "new_tokens": new_tokens,
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
