"""Where packed micro-batches spend their time: padded vs packed forward and forward+backward on one device.

GPU (one H200, the Llama-3.2-1B shape of conf/model/llama_1b.yaml, bf16; about 2 minutes):

    python benchmarks/packing_profile.py --out benchmarks/results/packing_profile_h200_$(date +%Y%m%d)

CPU smoke run (what tests/benchmarks/test_packing_profile.py runs; seconds):

    python benchmarks/packing_profile.py --device cpu --tiny --out /tmp/packing_profile

The same rows (random tokens, right-padded to `--width`, true lengths uniform in [min_fraction * width,
width], so ~5 % padding by default, like ppo_llama_1b_h200's responses) run as (a) `--micro-batch` padded
rows per micro-batch and (b) packed to each `--budgets` token budget, through the project's own path:
`ModelRole.micro_batches` (hybridflow.data.packing) and `ModelRole.forward` with `per_token_logprobs` (what
ref / old_logprobs do), and `run_forward_backward` with a log-prob + entropy loss over `as_rows` (what the
actor update does; no optimizer step). Timing: CUDA synchronize around `--repeats` timed runs after
`--warmup` runs. Per variant one more run under torch.profiler gives the top `--top` CUDA kernels and CPU
ops, and one under CUDA sync-debug mode counts host synchronisations. Writes `profile.md` and
`profile.json` under `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch
from transformers import LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.actor_mfu import init_single_process  # noqa: E402
from hybridflow.data.packing import as_rows  # noqa: E402
from hybridflow.errors import UserError, cli_errors  # noqa: E402
from hybridflow.placement import ParallelDims, RoleMesh  # noqa: E402
from hybridflow.roles.model_role import ModelRole, per_token_logprobs, zero_sequence_starts  # noqa: E402
from megatron_adapters.checkpoint import unwrap  # noqa: E402
from megatron_adapters.forward_backward import run_forward_backward  # noqa: E402
from megatron_adapters.model import build_gpt  # noqa: E402
from megatron_adapters.optimizer import wrap_for_training  # noqa: E402
from megatron_adapters.process_groups import build_role_groups, seed_role_rng  # noqa: E402

LLAMA_1B = dict(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256)  # conf/model/llama_1b
TINY = dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=256)
TINY_RUN = dict(rows=6, width=48, micro_batch=2, budgets="96,160", repeats=1, warmup=1)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for profile.md and profile.json")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--tiny", action="store_true", help="tiny model and batch (CPU smoke run)")
    for name, default in LLAMA_1B.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None,
                            help=f"model {name} (default {default}; tiny {TINY[name]})")
    parser.add_argument("--spec", default="auto", help="layer spec: auto | te | sdpa")
    parser.add_argument("--rows", type=int, default=None, help="sequences per stage (default 64)")
    parser.add_argument("--width", type=int, default=None, help="padded row width in tokens (default 1088)")
    parser.add_argument("--min-fraction", type=float, default=0.9,
                        help="shortest true length as a fraction of --width (default 0.9: ~5 %% padding)")
    parser.add_argument("--micro-batch", type=int, default=None, help="padded rows per micro-batch (default 4)")
    parser.add_argument("--budgets", default=None,
                        help="comma-separated packing token budgets (default 4352,8192,16384)")
    parser.add_argument("--modes", default="forward,train", help="forward and/or train (comma-separated)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per variant and mode (default 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 1)")
    parser.add_argument("--top", type=int, default=15, help="rows of each profiler table")
    parser.add_argument("--no-profile", action="store_true", help="skip torch.profiler and sync counting")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    shape = TINY if args.tiny else LLAMA_1B
    for name, default in shape.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    run_defaults = TINY_RUN if args.tiny else dict(rows=64, width=1088, micro_batch=4,
                                                   budgets="4352,8192,16384", repeats=3, warmup=1)
    for name, default in run_defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def synthetic_rows(rows: int, width: int, min_fraction: float, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """Right-padded random rows as a step batch hands them to a role: `input_ids`, `seq_lens`, and a
    `loss_mask` over all but each row's first 16 tokens (the "prompt")."""
    gen = torch.Generator().manual_seed(seed)
    shortest = max(2, int(min_fraction * width))
    seq_lens = torch.randint(shortest, width + 1, (rows,), generator=gen)
    columns = torch.arange(width)[None, :]
    real = columns < seq_lens[:, None]
    input_ids = torch.randint(0, vocab, (rows, width), generator=gen) * real
    prompt = min(16, shortest - 1)
    return {"input_ids": input_ids, "seq_lens": seq_lens, "loss_mask": (real & (columns >= prompt)).long()}


def logprob_entropy_loss(role: ModelRole):
    """The actor update's shape of loss: log-probs and entropies of the micro-batch's tokens, back to rows
    (`as_rows`, as rl_step's aggregation does), masked token mean."""

    def fn(logits: torch.Tensor, mb: dict[str, torch.Tensor]):
        logp, entropy = role.logprobs(logits, mb["input_ids"], with_entropy=True)
        logp, entropy = zero_sequence_starts(logp, mb), zero_sequence_starts(entropy, mb)
        mask = as_rows(mb["loss_mask"], mb).float()
        total = (as_rows(logp, mb) * mask).sum() + 0.01 * (as_rows(entropy, mb) * mask).sum()
        tokens = mask.sum()
        return -total / tokens.clamp(min=1), {"num_tokens": tokens.detach()}

    return fn


def run_once(role: ModelRole, tensors: dict[str, torch.Tensor], mode: str) -> None:
    """One stage of `mode` over all rows, as the trainer runs it (batch on the host, moved per stage)."""
    if mode == "forward":
        role.forward(tensors, per_token_logprobs(role, 1.0))
        return
    role.model.zero_grad_buffer()
    run_forward_backward([role.model], role.groups, role.micro_batches(tensors), logprob_entropy_loss(role))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_variant(role, tensors, mode, device, warmup: int, repeats: int) -> dict:
    """Mean seconds of `mode` over all rows, micro-batch count, and peak device memory."""
    for _ in range(warmup):
        run_once(role, tensors, mode)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(repeats):
        run_once(role, tensors, mode)
    synchronize(device)
    seconds = (time.perf_counter() - start) / repeats
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    return {"seconds": seconds, "micro_batches": len(role.micro_batches(tensors)), "peak_gib": peak}


def count_host_syncs(role, tensors, mode, device) -> int | None:
    """Host synchronisations (.item(), .tolist(), device->host copies) in one run, from CUDA sync-debug mode."""
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run_once(role, tensors, mode)
            synchronize(device)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def profile_tables(role, tensors, mode, device, top: int) -> dict[str, str]:
    """torch.profiler's top `top` device kernels and CPU ops of one run, as text tables."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        run_once(role, tensors, mode)
        synchronize(device)
    averages = prof.key_averages()
    tables = {"cpu": averages.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=60)}
    if device.type == "cuda":
        tables["cuda"] = averages.table(sort_by="self_device_time_total", row_limit=top, max_name_column_width=60)
    return tables


def build_role(args, device: torch.device) -> ModelRole:
    """A trained-role-shaped ModelRole (megatron DDP over one rank) of a random Llama of the CLI's shape."""
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.ffn, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                      max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
                      architectures=["LlamaForCausalLM"])
    groups = build_role_groups([0], tp=1, pp=1, dp=1)
    seed_role_rng(args.seed, groups)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_gpt(cfg, groups, dtype=dtype, spec=args.spec)
    if device.type == "cuda":
        model.cuda()
    ddp = wrap_for_training([model], groups, use_distributed_optimizer=False)[0]
    return ModelRole("actor", RoleMesh("actor", (0,), ParallelDims(1, 1, 1)), groups, ddp, args.micro_batch)


def markdown(result: dict) -> str:
    lines = [f"# packing profile ({result['device']}, {result['spec']}, {result['dtype']}, torch {result['torch']})",
             "", f"model: {result['model']}", f"rows: {result['rows']}", "",
             "| variant | mode | micro-batches | seconds | tokens/s (real) | vs padded | peak GiB | host syncs "
             "| max abs logprob diff vs padded |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = {r["mode"]: r["seconds"] for r in result["runs"] if r["variant"] == "padded"}
    for r in result["runs"]:
        peak = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "-"
        syncs = r.get("host_syncs")
        lines.append(f"| {r['variant']} | {r['mode']} | {r['micro_batches']} | {r['seconds']:.4f} | "
                     f"{r['tokens_per_s']:,.0f} | {r['seconds'] / base[r['mode']]:.2f}x | {peak} | "
                     f"{'-' if syncs is None else syncs} | {r['max_abs_logprob_diff_vs_padded']:.2e} |")
    for r in result["runs"]:
        for kind, table in r.get("profile", {}).items():
            lines += ["", f"## {r['variant']} {r['mode']}: top {kind} ops", "", "```", table.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.device == "cpu":
        # init_single_process (and compute_device) pick CUDA whenever it is visible; CUDA is initialised
        # lazily, so hiding the devices here still takes effect.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    device = init_single_process()
    if args.device == "cuda" and device.type != "cuda":
        raise UserError("--device: cuda requested but no CUDA device is visible; use --device cpu or auto")
    role = build_role(args, device)
    tensors = synthetic_rows(args.rows, args.width, args.min_fraction, args.vocab, args.seed)
    real_tokens = int(tensors["seq_lens"].sum())
    budgets = [int(b) for b in args.budgets.split(",") if b]
    modes = [m for m in args.modes.split(",") if m]
    runs = []
    reference = None
    for variant, budget in [("padded", 0)] + [(f"packed{b}", b) for b in budgets]:
        role.max_tokens_per_micro_batch = budget
        # The packed path must compute what the padded one does, or its timing means nothing.
        logprobs = role.forward(tensors, per_token_logprobs(role, 1.0)).float() * tensors["loss_mask"].to(device)
        reference = logprobs if reference is None else reference
        for mode in modes:
            run = {"variant": variant, "budget": budget, "mode": mode,
                   **time_variant(role, tensors, mode, device, args.warmup, args.repeats)}
            run["tokens_per_s"] = real_tokens / run["seconds"]
            run["max_abs_logprob_diff_vs_padded"] = float((logprobs - reference).abs().max())
            if not args.no_profile:
                run["host_syncs"] = count_host_syncs(role, tensors, mode, device)
                run["profile"] = profile_tables(role, tensors, mode, device, args.top)
            runs.append(run)
            print(f"[packing_profile] {variant} {mode}: {run['micro_batches']} micro-batches, "
                  f"{run['seconds']:.4f} s, {run['tokens_per_s']:,.0f} tok/s", flush=True)
    result = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "spec": unwrap(role.model).spec_name,
        "dtype": "bf16" if device.type == "cuda" else "fp32",
        "model": {k: getattr(args, k) for k in LLAMA_1B},
        "rows": {"count": args.rows, "width": args.width, "real_tokens": real_tokens,
                 "padding_fraction": 1 - real_tokens / (args.rows * args.width), "micro_batch": args.micro_batch},
        "runs": runs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(result, indent=1))
    (out / "profile.md").write_text(markdown(result))
    torch.distributed.destroy_process_group()
    return result


if __name__ == "__main__":
    with cli_errors():
        main()
