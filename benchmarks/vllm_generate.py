"""Where vLLM's generation time goes: hybridflow's engine against plain `LLM.generate` variants.

    python -m benchmarks.vllm_generate --out DIR        # one GPU with vLLM; the llama_1b shape, dummy weights

The same decode-bound requests (`--batch` random prompts of `--prompt` tokens, `--new-tokens` each, no
early stop) run as:
  engine <seed_mode> [no-logprob]  VllmRolloutEngine.generate with rollout.seed_mode = per_request (every row
                                   its own seed) or per_batch (the default: vLLM's engine-wide generator),
                                   with sampled log-probs (a parity-gate / TIS step) or without (the other
                                   steps); includes the conversion into a RolloutBatch
  llm seeded              the per_request vllm.SamplingParams straight to LLM.generate (engine minus conversion)
  llm unseeded            without per-request seeds
  llm unseeded no-logprob without per-request seeds and without log-probs
Each is run once untimed, then `--repeats` times. Writes vllm_generate.json and .md under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.provenance import provenance  # noqa: E402
from hybridflow.families import family_for_architecture  # noqa: E402
from hybridflow.placement import ParallelDims, RoleMesh  # noqa: E402
from hybridflow.rollout.base import RolloutBatch, SamplingParams  # noqa: E402
from hybridflow.rollout.vllm_engine import VllmEngineSpec, VllmRolloutEngine, request_seed, sampling_kwargs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for vllm_generate.json / .md")
    parser.add_argument("--model", default="llama_1b", help="a conf/model/<name>.yaml shape")
    parser.add_argument("--batch", type=int, default=64, help="requests per generate call")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per request")
    parser.add_argument("--new-tokens", type=int, default=1024, help="tokens generated per request")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per variant")
    return parser.parse_args(argv)


def write_config(model: str, out: Path) -> Path:
    """An HF config.json of conf/model/<model>.yaml (the engine loads dummy weights, so no weights)."""
    import yaml
    from transformers import AutoConfig

    fields = yaml.safe_load((REPO / "conf" / "model" / f"{model}.yaml").read_text())
    arch = fields.pop("architecture")
    fields.pop("dtype", None)
    fields.pop("path", None)
    model_type = family_for_architecture(arch).model_type
    config = AutoConfig.for_model(model_type, architectures=[arch], torch_dtype="bfloat16", **fields)
    path = out / "model"
    config.save_pretrained(path)
    return path


def timed(call, repeats: int) -> list[float]:
    call()  # untimed: first-call allocations
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return seconds


def main(argv=None) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    width = args.prompt + args.new_tokens
    spec = VllmEngineSpec(str(write_config(args.model, out)), tp=1, gpu_memory_utilization=0.3,
                          engine_args={"max_num_seqs": max(args.batch, 1), "max_model_len": width})
    start = time.perf_counter()
    engine = VllmRolloutEngine.create(spec, RoleMesh("rollout", (0,), ParallelDims(1, 1, 1)))
    start_s = time.perf_counter() - start

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(10, 1000, (args.batch, width), generator=gen)
    batch = RolloutBatch(tokens, torch.full((args.batch,), args.prompt))
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=7)
    prompts = [{"prompt_token_ids": row[: args.prompt].tolist()} for row in tokens]

    def params(seeded: bool, logprobs: bool) -> list:
        wanted = dataclasses.replace(sampling, logprobs=logprobs)
        return [engine.sampling_params_cls(**sampling_kwargs(wanted, args.new_tokens,
                                                             request_seed(sampling.seed, 0, row) if seeded else None))
                for row in range(args.batch)]

    def llm(seeded: bool, logprobs: bool):
        return lambda: engine.llm.generate(prompts, params(seeded, logprobs), use_tqdm=False)

    def hybridflow_engine(seed_mode: str, logprobs: bool):
        def call():
            engine.spec = dataclasses.replace(spec, seed_mode=seed_mode)
            out = engine.generate(batch, dataclasses.replace(sampling, logprobs=logprobs))
            assert (out.logprobs is not None) == logprobs
        return call

    variants = {
        "engine per_request": hybridflow_engine("per_request", True),
        "engine per_request no-logprob": hybridflow_engine("per_request", False),
        "engine per_batch": hybridflow_engine("per_batch", True),
        "engine per_batch no-logprob": hybridflow_engine("per_batch", False),
        "llm seeded": llm(True, True),
        "llm unseeded": llm(False, True),
        "llm unseeded no-logprob": llm(False, False),
    }
    rows = {}
    for name, call in variants.items():
        seconds = timed(call, args.repeats)
        mean = sum(seconds) / len(seconds)
        rows[name] = {"seconds": seconds, "mean_s": mean, "ms_per_step": 1e3 * mean / args.new_tokens,
                      "tokens_per_s": args.batch * args.new_tokens / mean}
        print(f"{name}: {mean:.3f} s ({rows[name]['ms_per_step']:.2f} ms per decode step)", flush=True)
    result = {"provenance": provenance(), "device": torch.cuda.get_device_name(0), "engine_start_s": start_s,
              "batch": args.batch, "prompt": args.prompt, "new_tokens": args.new_tokens, "model": args.model,
              "variants": rows}
    (out / "vllm_generate.json").write_text(json.dumps(result, indent=1))
    lines = [f"# vLLM generate: {args.model}, batch {args.batch}, prompt {args.prompt}, {args.new_tokens} new tokens",
             "", f"engine start {start_s:.1f} s", "", "| variant | s | ms per decode step | tokens/s |",
             "|---|---|---|---|"]
    lines += [f"| {n} | {r['mean_s']:.3f} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:,.0f} |"
              for n, r in rows.items()]
    (out / "vllm_generate.md").write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
