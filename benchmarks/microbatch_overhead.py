"""Per-micro-batch cost of our training stack: forward-only log-probs, GRPO actor forward + backward, optimizer step.

    python benchmarks/microbatch_overhead.py                       # tiny model (compute ~0): pure overhead
    python benchmarks/microbatch_overhead.py --shape smollm2_135m  # SmolLM2-135M's shape, bf16 on GPU
    python benchmarks/microbatch_overhead.py --json out.json --profile

It runs the real path of one RL step's stages on a one-rank world (nccl on GPU 0, else gloo + the CPU
backend): `ModelRole.forward` with `per_token_logprobs` (what reference and old log-probs do) and
`RLTrainer._update` with the GRPO actor loss (KL loss term, token-mean), over a batch of `--rows` samples of
`--seq` tokens cut into micro-batches of each `--micro-batch-sizes` (one mini-batch = the whole batch, so
one optimizer step per update). Each figure is the median over `--repeats` passes, divided by the pass's
micro-batch count; the overhead is the intercept of the line through the per-micro-batch times of the two
smallest sizes against their rows (what a micro-batch costs beyond its tokens; the time at size 1 bounds
it). The optimizer step is timed on its own, and the forward pass once more as a run sizes it by default
(`roles.<role>.forward_max_tokens` over `--seq`, micro_batch_size 1).

Host syncs per pass: the count of `aten::_local_scalar_dense` (every `.item()` / `float()` / `int()` of a
tensor; not the ones torch's fused Adam makes inside its CPU kernel, which reads its host step counters and
on CUDA reads nothing) and of collectives in a torch.profiler trace; on CUDA also the synchronising operations that
`torch.cuda.set_sync_debug_mode("warn")` reports. `--profile` prints the top ops by self CPU time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.actor_mfu import SMOLLM2_135M, init_single_process  # noqa: E402
from hybridflow.algorithms import build_algorithm, build_kl_controller  # noqa: E402
from hybridflow.config import ExperimentConfig  # noqa: E402
from hybridflow.config.parallel import RoleConfig  # noqa: E402
from hybridflow.data.step_batch import StepBatch  # noqa: E402
from hybridflow.placement import ParallelDims, RoleMesh  # noqa: E402
from hybridflow.roles.model_role import (  # noqa: E402
    ModelRole,
    OptimizerSettings,
    build_model_role,
    per_token_logprobs,
    role_config_overrides,
)
from hybridflow.token_kinds import TokenKind  # noqa: E402
from hybridflow.trainer.rl_trainer import RLTrainer  # noqa: E402
from megatron_adapters.process_groups import build_role_groups  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False)
SHAPES = {"tiny": TINY, "smollm2_135m": {**SMOLLM2_135M, "tie_word_embeddings": True}}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="model shape (default tiny)")
    parser.add_argument("--rows", type=int, default=64, help="samples per pass (default 64)")
    parser.add_argument("--seq", type=int, default=192, help="tokens per sample (default 192)")
    parser.add_argument("--prompt", type=int, default=96, help="prompt tokens of each sample (default 96)")
    parser.add_argument("--micro-batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per figure (median)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default=None, help="default bf16 on GPU, fp32 on CPU")
    parser.add_argument("--profile", action="store_true",
                        help="print per pass the top ops by self CUDA time (self CPU time on a CPU) and the "
                             "cudaStreamSynchronize / D2H copy counts")
    parser.add_argument("--trace", default=None,
                        help="with --profile: write each pass's Chrome trace gzipped, PATH.mbs<N>.<pass>.json.gz")
    parser.add_argument("--json", default=None, help="also write the results as JSON here")
    return parser.parse_args(argv)


def save_random_checkpoint(shape: dict, seq: int, out_dir: Path, dtype: torch.dtype) -> None:
    """A randomly initialised Llama of `shape`, saved as an HF checkpoint (build_model_role loads from disk)."""
    cfg = LlamaConfig(**shape, max_position_embeddings=max(seq, 256), architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(dtype).save_pretrained(out_dir)


def step_batch(rows: int, seq: int, prompt: int, vocab: int) -> StepBatch:
    """A generated batch: `prompt` prompt tokens, responses of varying length up to `seq`, random log-probs."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, vocab, (rows, seq), generator=gen)
    lengths = torch.randint(max(1, (seq - prompt) // 2), seq - prompt + 1, (rows,), generator=gen)
    columns = torch.arange(seq)[None, :]
    response = (columns >= prompt) & (columns < prompt + lengths[:, None])
    kinds = torch.where(response, int(TokenKind.ASSISTANT), torch.where(columns < prompt, int(TokenKind.PROMPT), 0))
    mask = response.float()
    logprobs = -torch.rand(rows, seq, generator=gen) * mask
    batch = StepBatch(rows=[{}] * rows, tokens=tokens, prompt_lens=torch.full((rows,), prompt),
                      token_kinds=kinds.long(), rollout_logprobs=logprobs)
    batch.old_logprobs, batch.ref_logprobs = logprobs.clone(), logprobs - 0.01 * mask
    batch.advantages = torch.randn(rows, 1, generator=gen).expand(rows, seq) * mask
    return batch


def grpo_trainer(actor: ModelRole, mesh: RoleMesh, rows: int) -> RLTrainer:
    """An RLTrainer holding only `actor`: GRPO's loss (KL to the reference as a loss term), one mini-batch."""
    cfg = ExperimentConfig()
    alg = cfg.algorithm
    alg.name, alg.kl_in_reward, alg.kl_coef, alg.whiten_advantages = "grpo", False, 0.04, False
    alg.mini_batch_size, alg.ppo_epochs = rows, 1
    cfg.roles.critic.enabled, cfg.rollout.n_samples_per_prompt = False, 2  # what grpo's record asks of a run
    return RLTrainer(cfg=cfg, roles={"actor": actor}, meshes={"actor": mesh, "ref": mesh}, rollout=None,
                     scorer=None, kl_ctl=build_kl_controller("fixed", alg.kl_coef, alg.kl_target, alg.kl_horizon),
                     algorithm=build_algorithm(cfg), device=torch.device("cpu"), training=None)


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of `fn` (CUDA work finished inside each timing)."""
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# Profiler names of host waits on the GPU: the runtime's sync calls and device-to-host copies (the GPU-side
# activity of a .item() / .tolist() / .cpu()).
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
D2H_COPY = "Memcpy DtoH"


def host_syncs(fn: Callable[[], object], top: int = 0, trace: Path | None = None) -> dict:
    """Syncs and collectives of one call of `fn` from a profiler trace (and CUDA's sync debug mode); with
    `top`, the ops of most self CUDA time (self CPU time on a CPU); with `trace`, the Chrome trace gzipped there."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        fn()
        if on_gpu:
            torch.cuda.synchronize()
    events = prof.key_averages()
    scalar = sum(1 for e in prof.events() if e.name == "aten::_local_scalar_dense" and not _in_fused_optimizer(e))
    # c10d's dispatcher ops (c10d::allreduce_, ...): one per collective on gloo and NCCL alike
    collectives = sum(e.count for e in events if e.key.startswith("c10d::"))
    out = {"item_calls": scalar, "collectives": collectives,
           "sync_calls": sum(e.count for e in events if e.key in SYNC_CALLS),
           "d2h_copies": sum(e.count for e in events if e.key.startswith(D2H_COPY))}
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        plain = trace.with_name(trace.name.removesuffix(".gz"))
        prof.export_chrome_trace(str(plain))
        with plain.open("rb") as src, gzip.open(trace, "wb") as dst:
            shutil.copyfileobj(src, dst)
        plain.unlink()
        out["trace"] = str(trace)
    if on_gpu:
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
        torch.cuda.set_sync_debug_mode("default")
        out["cuda_sync_warnings"] = sum("synchroniz" in str(w.message) for w in caught)
    if top:
        def self_us(e) -> float:
            return e.self_device_time_total if on_gpu else e.self_cpu_time_total

        out["top_by"] = "self CUDA" if on_gpu else "self CPU"
        out["top_ops"] = [(e.key, e.count, self_us(e) / 1e3) for e in sorted(events, key=lambda e: -self_us(e))[:top]]
    return out


def trace_path(base: str | None, mbs: int, name: str) -> Path | None:
    """`--trace`'s path for one micro-batch size and pass: trace.json.gz -> trace.mbs4.forward.json.gz."""
    if base is None:
        return None
    path = Path(base)
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    return path.with_name(f"{stem}.mbs{mbs}.{name}.json.gz")


def _in_fused_optimizer(event) -> bool:
    """Whether a profiler event runs inside torch's fused Adam kernel: on CPU it reads each parameter's step
    counter (host memory) in C++; on CUDA the counters stay on the device and it reads nothing."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(("aten::_fused_adam", "aten::_fused_adamw")):
            return True
        parent = parent.cpu_parent
    return False


def overhead_fit(points: list[tuple[int, float]]) -> float:
    """Intercept of the line time = a + b * rows through the two (rows, time) points of fewest rows (the
    large sizes' times are compute, whose cost per row is not constant on a CPU)."""
    smallest = sorted(points)[:2]
    if len(smallest) == 1:
        return smallest[0][1]
    (x0, y0), (x1, y1) = smallest
    return y0 - (y1 - y0) / (x1 - x0) * x0


def measure(actor: ModelRole, trainer: RLTrainer, batch: StepBatch, mbs: int, args) -> dict:
    """Per-micro-batch figures of one micro-batch size."""
    actor.micro_batch_size = mbs
    n_micro = -(-batch.size // mbs)
    forward = per_token_logprobs(actor, 1.0)
    optimizer_s: list[float] = []
    step = actor.optimizer.step

    def timed_step():
        start = time.perf_counter()
        out = step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        optimizer_s.append(time.perf_counter() - start)
        return out

    def forward_pass():
        actor.model.eval()
        return trainer._infer("actor", batch, lambda r: forward)

    def update_pass():
        actor.model.train()
        return trainer._update("actor", batch, trainer._actor_loss(1.0), trainer._actor_fields())

    actor.optimizer.step = timed_step
    try:
        forward_pass(), update_pass()  # warm-up
        optimizer_s.clear()
        forward_s = timed(forward_pass, args.repeats)
        update_s = timed(update_pass, args.repeats)
        step_s = statistics.median(optimizer_s)
        row = {"micro_batch_size": mbs, "micro_batches": n_micro,
               "forward_ms": forward_s / n_micro * 1e3,
               "forward_backward_ms": (update_s - step_s) / n_micro * 1e3,
               "optimizer_step_ms": step_s * 1e3,
               "forward_pass_s": forward_s, "update_pass_s": update_s}
        top = 15 if args.profile else 0
        traces = args.trace if args.profile else None
        row["forward_syncs"] = host_syncs(forward_pass, top, trace_path(traces, mbs, "forward"))
        row["update_syncs"] = host_syncs(update_pass, top, trace_path(traces, mbs, "update"))
    finally:
        actor.optimizer.step = step
    return row


def budgeted_forward(actor: ModelRole, trainer: RLTrainer, batch: StepBatch, args) -> dict:
    """The forward pass as a run sizes it by default: `roles.<role>.forward_max_tokens` over the width."""
    budget = RoleConfig().forward_max_tokens
    actor.micro_batch_size = 1
    actor.forward_micro_batch_size = RoleConfig(micro_batch_size=1).forward_micro_batch_size(args.seq)
    forward = per_token_logprobs(actor, 1.0)
    actor.model.eval()
    try:
        seconds = timed(lambda: trainer._infer("actor", batch, lambda r: forward), args.repeats)
        count = len(actor.micro_batches(batch.tensors(), actor.forward_micro_batch_size))
    finally:
        actor.forward_micro_batch_size = 0
    return {"forward_max_tokens": budget, "micro_batches": count, "forward_pass_s": seconds}


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = init_single_process()
    on_gpu = device.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if on_gpu else "fp32")]
    shape = SHAPES[args.shape]
    groups = build_role_groups([0], tp=1, pp=1, dp=1)
    mesh = RoleMesh("actor", (0,), ParallelDims(1, 1, 1))
    with tempfile.TemporaryDirectory() as tmp:
        save_random_checkpoint(shape, args.seq, Path(tmp), dtype)
        actor = build_model_role("actor", mesh, groups, tmp, "lm", dtype, 1, optimizer=OptimizerSettings(lr=1e-6),
                                 seed=0, **role_config_overrides(True, 1, RoleConfig().activation_recompute))
    trainer = grpo_trainer(actor, mesh, args.rows)
    batch = step_batch(args.rows, args.seq, args.prompt, shape["vocab_size"])
    rows = [measure(actor, trainer, batch, mbs, args) for mbs in args.micro_batch_sizes]
    budget = budgeted_forward(actor, trainer, batch, args)
    result = {
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "torch_threads": torch.get_num_threads(),
        "shape": args.shape, "dtype": str(dtype).removeprefix("torch."),
        "rows": args.rows, "seq": args.seq, "repeats": args.repeats,
        "forward_overhead_ms": overhead_fit([(r["micro_batch_size"], r["forward_ms"]) for r in rows]),
        "forward_backward_overhead_ms": overhead_fit(
            [(r["micro_batch_size"], r["forward_backward_ms"]) for r in rows]),
        "micro_batch_sizes": rows,
        "budgeted_forward": budget,
    }
    print_table(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    dist.destroy_process_group()
    return result


def print_table(result: dict) -> None:
    print(f"{result['shape']} {result['dtype']} on {result['device']} ({result['torch_threads']} threads), "
          f"{result['rows']} rows x {result['seq']} tokens per pass, median of {result['repeats']}")
    print(f"{'mbs':>4} {'n_mb':>5} {'fwd ms/mb':>10} {'fwd+bwd ms/mb':>14} {'opt step ms':>12} "
          f"{'fwd syncs':>10} {'fwd coll':>9} {'upd syncs':>10} {'upd coll':>9}")
    for r in result["micro_batch_sizes"]:
        f, u = r["forward_syncs"], r["update_syncs"]
        print(f"{r['micro_batch_size']:>4} {r['micro_batches']:>5} {r['forward_ms']:>10.2f} "
              f"{r['forward_backward_ms']:>14.2f} {r['optimizer_step_ms']:>12.2f} {f['item_calls']:>10} "
              f"{f['collectives']:>9} {u['item_calls']:>10} {u['collectives']:>9}")
        for name in ("forward_syncs", "update_syncs"):
            if "cuda_sync_warnings" in r[name]:
                print(f"     {name}: {r[name]['cuda_sync_warnings']} CUDA sync warnings")
            if "top_ops" in r[name]:
                print(f"     {name}: {r[name]['sync_calls']} stream/device syncs, {r[name]['d2h_copies']} D2H "
                      f"copies; top ops by {r[name]['top_by']} time" + (f" (trace {r[name]['trace']})"
                                                                        if "trace" in r[name] else ""))
            for key, count, ms in r[name].get("top_ops", []):
                print(f"     {name} {key:<50} {count:>6} {ms:>9.2f} ms")
    b = result["budgeted_forward"]
    print(f"forward pass at forward_max_tokens={b['forward_max_tokens']}: {b['micro_batches']} micro-batches, "
          f"{b['forward_pass_s'] * 1e3:.1f} ms")
    print(f"overhead per micro-batch (intercept): forward {result['forward_overhead_ms']:.2f} ms, "
          f"forward+backward {result['forward_backward_overhead_ms']:.2f} ms")


if __name__ == "__main__":
    main()
