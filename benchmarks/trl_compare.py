"""hybridflow vs Hugging Face TRL on the same GRPO work on one GPU, in one run:

    python -m benchmarks.trl_compare --out DIR [--model llama3_2_3b] [--placement colocated:megatron,colocated:vllm]
        [--sides hybridflow,trl] [--prompts 32 --samples-per-prompt 4 --response-length 512 --mini-batch 64
        --micro-batch 4 --ppo-epochs 1 --warmup-steps 1 --steps 2] [-- hydra overrides]
    python -m benchmarks.trl_compare --out DIR --dry-run    # CPU: argument handling and config mapping only

Both sides load one Llama-shaped random checkpoint built here (`--model`, else `+experiment`'s model shape:
ppo_llama_1b_h200's ~1.2B) with hybridflow's character tokenizer, take the same built-in prompts, generate exactly
`--response-length` tokens per sample (no early stop), and run GRPO (TRL has no PPO trainer in 1.x; GRPO is
the work both can do: group advantages, no critic, KL to the reference as a loss term, `--ppo-epochs`
passes). hybridflow runs first (`python -m hybridflow.run`, once per `--placement` entry, e.g. once per rollout
engine), then TRL in a fresh process. Written to DIR: compare.json, compare.md, hybridflow_<placement>.json and
hybridflow/<placement>/ (each run), trl.json. The figure is the ratio of (prompt + response tokens) / step time,
hybridflow over TRL (benchmarks/token_count.py counts both sides' tokens from their token ids; samples/s and
step time stand beside it). `--sides` runs only some sides now: a later call into the same DIR adds the others (the
checkpoint is reused), and compare.json holds every side found there.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from benchmarks.placement_run import Sweep, run_name, run_overrides, run_placement
from benchmarks.provenance import REPO_ROOT, provenance
from benchmarks.trl_grpo import SharedWork, grpo_config_kwargs
from hybridflow.errors import cli_errors
from hybridflow.placement import plan_placement
from hybridflow.resolve import resolve_experiment

PROMPT_LENGTH = 32  # data.max_prompt_length; the built-in prompts are a few characters


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trl_compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--experiment", default="ppo_llama_1b_h200")
    parser.add_argument("--model", default=None, help="a conf/model shape for both sides (default: the experiment's)")
    parser.add_argument("--placement", default="colocated",
                        help="comma-separated conf/placement names for hybridflow, NAME:ENGINE to pick the rollout "
                             "engine too (colocated:megatron,colocated:vllm): one run each")
    parser.add_argument("--sides", default="hybridflow,trl", help="the sides to run now: hybridflow, trl or both")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples-per-prompt", type=int, default=4)
    parser.add_argument("--response-length", type=int, default=512)
    parser.add_argument("--mini-batch", type=int, default=64, help="samples per optimizer step")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--ppo-epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--kl-coef", type=float, default=0.04)
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--trl-generation", default="vllm-colocate", choices=("vllm-colocate", "hf"),
                        help="TRL's generation backend (default: vLLM colocated, TRL's fast path)")
    parser.add_argument("--trl-dtype", default="fp32", choices=("fp32", "bf16"),
                        help="TRL's policy weights: fp32 under bf16 autocast (mixed precision, default) or pure bf16")
    parser.add_argument("--dry-run", action="store_true", help="check arguments and the config mapping only")
    return parse_with_overrides(parser, argv)


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """`parser`'s flags from before a `--`, and the hydra overrides for the hybridflow side after it."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:cut]), argv[cut + 1:]


SIDES = ("hybridflow", "trl")


def shared_work(args: argparse.Namespace, model_dir: Path) -> SharedWork:
    work = SharedWork(model_dir=str(model_dir), prompts=args.prompts, samples_per_prompt=args.samples_per_prompt,
                      response_length=args.response_length, mini_batch_size=args.mini_batch,
                      micro_batch_size=args.micro_batch, ppo_epochs=args.ppo_epochs, lr=args.lr,
                      kl_coef=args.kl_coef, cliprange=0.2, temperature=1.0, warmup_steps=args.warmup_steps,
                      steps=args.steps, seed=args.seed, trl_generation=args.trl_generation,
                      trl_dtype=args.trl_dtype)
    work.check()
    return work


def sides_of(text: str) -> tuple[str, ...]:
    sides = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in sides if s not in SIDES]
    if unknown or not sides:
        raise ValueError(f"--sides: {text!r}; use hybridflow, trl or hybridflow,trl")
    return sides


def model_overrides(model: str | None) -> list[str]:
    """The `--model` shape as the hydra override both the checkpoint and the hybridflow run take."""
    return [f"model={model}"] if model else []


def hybridflow_overrides(work: SharedWork, extra: list[str], model: str | None = None) -> list[str]:
    """The experiment switched to the shared GRPO work, loading the shared checkpoint and tokenizer."""
    return [*model_overrides(model), "algorithm=grpo", "roles.critic.enabled=false", f"model.path={work.model_dir}",
            f"data.tokenizer={work.model_dir}", f"data.source={work.task}", f"data.train_batch_size={work.prompts}",
            f"data.max_prompt_length={PROMPT_LENGTH}", f"data.seq_length={PROMPT_LENGTH + work.response_length}",
            f"rollout.n_samples_per_prompt={work.samples_per_prompt}",
            f"rollout.max_new_tokens={work.response_length}", "rollout.stop_token_ids=[]",
            f"rollout.temperature={work.temperature}", "rollout.top_p=1.0", "rollout.top_k=-1",
            f"algorithm.mini_batch_size={work.mini_batch_size}", f"algorithm.ppo_epochs={work.ppo_epochs}",
            f"algorithm.kl_coef={work.kl_coef}", f"algorithm.cliprange={work.cliprange}",
            f"roles.actor.micro_batch_size={work.micro_batch_size}", f"trainer.lr={work.lr}",
            f"trainer.seed={work.seed}", *extra]


def build_checkpoint(experiment: str, model_dir: Path, seed: int, weights: bool = True,
                     model: str | None = None) -> None:
    """The shared random checkpoint (`model`'s shape, else the experiment's) and character tokenizer.

    `weights=False` (dry run) writes only config.json, enough for the config to load and plan.
    """
    import transformers

    from hybridflow.data import build_char_tokenizer
    from hybridflow.trainer.model_files import random_hf_checkpoint

    shape = resolve_experiment(experiment, model_overrides(model)).model
    if weights and not any(model_dir.glob("*.safetensors")):
        random_hf_checkpoint(shape, model_dir, seed, dtype="fp32")  # TRL's side trains from the fp32 weights
    elif not weights:
        transformers.LlamaConfig(
            hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
            num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
            num_key_value_heads=shape.num_key_value_heads, vocab_size=shape.vocab_size,
            max_position_embeddings=shape.max_position_embeddings, rope_theta=shape.rope_theta,
            rms_norm_eps=shape.rms_norm_eps, tie_word_embeddings=shape.tie_word_embeddings,
            bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(model_dir)
    build_char_tokenizer(model_dir)


HYBRIDFLOW_KEYS = ("throughput_tokens_per_s", "step_time_s", "tokens_per_step", "peak_memory_gib", "stage_time_s",
                   "actor_update")


def trl_file(work: SharedWork) -> str:
    """Where a TRL side's result goes: trl.json (mixed precision, the reference), trl_bf16.json (pure bf16)."""
    return "trl.json" if work.trl_dtype == "fp32" else f"trl_{work.trl_dtype}.json"


def collect(out: Path, work: SharedWork) -> dict:
    """Every side found in `out` (this call's and earlier calls'), with each hybridflow run's throughput ratio to
    each TRL run (keyed by its file's stem: trl, trl_bf16)."""
    runs = {}
    for path in sorted(out.glob("hybridflow_*.json")):
        run = json.loads(path.read_text())
        if run.get("status") == "measured":
            runs[run["placement"]] = {"command": run["command"],
                                      **{k: run["measured"][k] for k in HYBRIDFLOW_KEYS}}
    trl = {path.stem: json.loads(path.read_text()) for path in sorted(out.glob("trl*.json")) if path.stem != "trl_spec"}
    ratios = {name: {side: r["throughput_tokens_per_s"] / t["throughput_tokens_per_s"] for side, t in trl.items()}
              for name, r in runs.items()}
    return {"meta": provenance(), "work": asdict(work), "hybridflow": runs, "trl": trl, "ratio": ratios}


def compare_markdown(result: dict) -> str:
    w, trl = result["work"], result["trl"]
    lines = [f"# hybridflow vs TRL GRPO, {result['meta']['device']}, {result['meta']['date']}, "
             f"commit {result['meta']['commit']}", "",
             f"work: {w['prompts']} prompts x {w['samples_per_prompt']} samples, {w['response_length']} response "
             f"tokens, mini-batch {w['mini_batch_size']}, micro-batch {w['micro_batch_size']}, "
             f"{w['ppo_epochs']} epoch(s), {w['steps']} timed step(s) after {w['warmup_steps']} warm-up", "",
             "tokens: prompt + response tokens per RL step, padding not counted, one counter for both sides "
             "(benchmarks/token_count.py)", "",
             "| framework | tokens/s | samples/s | step s | tokens/step | peak GiB |"
             + "".join(f" vs {t} |" for t in trl),
             "|---|---|---|---|---|---|" + "---|" * len(trl)]
    samples = w["prompts"] * w["samples_per_prompt"]
    rows = [(f"hybridflow {name}", r, result["ratio"][name]) for name, r in result["hybridflow"].items()]
    rows += [(t.get("framework", side), t, {}) for side, t in trl.items()]
    for name, r, ratio in rows:
        peak = r.get("peak_memory_gib")
        cells = "".join(f" **{ratio[t]:.2f}x** |" if t in ratio else " - |" for t in trl)
        lines.append(f"| {name} | {r['throughput_tokens_per_s']:,.0f} | {samples / r['step_time_s']:,.1f} | "
                     f"{r['step_time_s']:.2f} | "
                     f"{r['tokens_per_step']:,.0f} | {'-' if peak is None else f'{peak:.1f}'} |{cells}")
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> int:
    with cli_errors():
        args, extra = parse_args(sys.argv[1:] if argv is None else argv)
        sides = sides_of(args.sides)
        out = args.out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        model_dir = out / ("dry_run_model" if args.dry_run else "model")
        work = shared_work(args, model_dir)
        overrides = hybridflow_overrides(work, extra, args.model)
        placements = [p.strip() for p in args.placement.split(",") if p.strip()]
        if not any(model_dir.glob("*.safetensors")):
            build_checkpoint(args.experiment, model_dir, args.seed, weights=False, model=args.model)
        sweep = Sweep(args.experiment, tuple(overrides), work.warmup_steps, work.steps, out / "hybridflow")
        # Bad keys or a placement the planner rejects fail here, before the weights are built.
        configs = [resolve_experiment(args.experiment, run_overrides(sweep, p, sweep.out_dir / run_name(p), None))
                   for p in placements]
        for cfg in configs:
            plan_placement(cfg)
        (out / "trl_spec.json").write_text(json.dumps(asdict(work), indent=2))
        if args.dry_run:
            print(json.dumps(dry_run_report(configs[0], overrides, work, out), indent=2, default=str))
            return 0
        build_checkpoint(args.experiment, model_dir, args.seed, model=args.model)
        failed = []
        if "hybridflow" in sides:
            for placement in placements:
                hf_run = run_placement(sweep, placement, simulate=False)
                (out / f"hybridflow_{run_name(placement)}.json").write_text(json.dumps(hf_run, indent=2))
                if hf_run["status"] != "measured":
                    failed.append(f"hybridflow {placement} {hf_run['status']}: {hf_run.get('reason')}")
                    print(failed[-1], file=sys.stderr)
        if "trl" in sides:
            subprocess.run([sys.executable, "-m", "benchmarks.trl_grpo", "--spec", str(out / "trl_spec.json"),
                            "--out", str(out / trl_file(work))], cwd=REPO_ROOT, check=True)
        result = collect(out, work)
        (out / "compare.json").write_text(json.dumps(result, indent=2))
        (out / "compare.md").write_text(compare_markdown(result))
        print(compare_markdown(result))
        if failed:
            raise SystemExit("; ".join(failed))
    return 0


def dry_run_report(cfg, overrides: list[str], work: SharedWork, out: Path) -> dict:
    """What a real run would do: hybridflow's overrides and resolved figures, TRL's GRPOConfig fields."""
    kwargs = grpo_config_kwargs(work, str(out / "trl_output"), on_gpu=False)
    resolved = {"algorithm": cfg.algorithm.name, "critic": cfg.roles.critic.enabled,
                "prompts": cfg.data.train_batch_size, "samples_per_prompt": cfg.rollout.n_samples_per_prompt,
                "max_new_tokens": cfg.rollout.max_new_tokens, "stop_token_ids": list(cfg.rollout.stop_token_ids),
                "mini_batch_size": cfg.algorithm.mini_batch_size, "ppo_epochs": cfg.algorithm.ppo_epochs,
                "hidden_size": cfg.model.hidden_size, "layers": cfg.model.num_hidden_layers}
    return {"hybridflow_overrides": overrides, "hybridflow_resolved": resolved, "grpo_config": kwargs,
            "grpo_config_check": _construct_grpo_config(kwargs)}


def _construct_grpo_config(kwargs: dict) -> str:
    """Build TRL's GRPOConfig from the mapping when TRL is importable here (its own checks run)."""
    try:
        from trl import GRPOConfig
    except ImportError as err:
        return f"not checked: trl is not importable here ({err})"
    config = GRPOConfig(**kwargs)
    return (f"ok: trl GRPOConfig built; generation_batch_size={config.generation_batch_size}, "
            f"steps_per_generation={config.steps_per_generation}")


if __name__ == "__main__":
    raise SystemExit(main())
