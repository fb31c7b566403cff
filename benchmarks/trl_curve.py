"""hybridflow vs TRL on a real model and task: the same GRPO work, throughput and held-out accuracy per seed.

    python -m benchmarks.trl_curve --out DIR [--experiment grpo_smollm2 --seeds 1,2 --steps 40 --eval-every 10]
        [--trl-generation vllm-colocate|hf] [--label NAME] [-- hydra overrides for the hybridflow side]
    python -m benchmarks.trl_curve --out DIR --dry-run     # CPU: the config mapping only

The experiment names the model (a real checkpoint, e.g. SmolLM2-135M-Instruct from `model=smollm2_135m`), the
built-in task (chat prompts, `#### n` answers) and every hyperparameter. For each seed hybridflow runs it
(`python -m hybridflow.run`, validating greedily on the held-out split every `--eval-every` steps), then TRL's
`GRPOTrainer` in a fresh process on the same checkpoint, task, seed, batch shape, learning rate, KL coefficient,
clip range, temperature and response limit (responses end at eos on both sides), evaluated on the same held-out
prompts with greedy decoding at the same steps. Written to DIR: compare.json, compare.md, accuracy.png (held-out
accuracy against samples trained on, both frameworks, every seed), hybridflow_s<seed>/, trl_s<seed>.json.
`--label NAME` names a hybridflow variant (its overrides) `hybridflow-<engine>-NAME`, so variants and TRL share one
DIR and one compare.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.provenance import REPO_ROOT, provenance
from benchmarks.run_summary import read_rl_records
from benchmarks.token_count import hybridflow_step_tokens, rates
from benchmarks.trl_compare import parse_with_overrides
from benchmarks.trl_grpo import SharedWork, grpo_config_kwargs
from hybridflow.config import ExperimentConfig
from hybridflow.errors import UserError, cli_errors
from hybridflow.launch.ports import free_port
from hybridflow.resolve import resolve_experiment


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trl_curve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--experiment", default="grpo_smollm2")
    parser.add_argument("--seeds", default="1,2", help="comma-separated trainer.seed values, one run each side")
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default: the experiment's total_steps)")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="RL steps between held-out evaluations (default: the experiment's trainer.val_every)")
    parser.add_argument("--trl-generation", default="vllm-colocate", choices=("vllm-colocate", "hf"))
    parser.add_argument("--sides", default="hybridflow,trl", help="which frameworks to run (comma-separated)")
    parser.add_argument("--label", default="", help="a name for this hybridflow variant: its side is "
                        "hybridflow-<engine>-LABEL, beside the others in the same --out")
    parser.add_argument("--dry-run", action="store_true", help="check the config mapping only")
    return parse_with_overrides(parser, argv)


# hybridflow's rule rewards and the SharedWork.reward name TRL's side scores with (benchmarks.trl_grpo.scorer)
TRL_REWARDS = {"hybridflow.rewards.gsm8k:gsm8k": "gsm8k", "hybridflow.rewards.word_order:word_order": "word_order"}


def shared_work(cfg: ExperimentConfig, steps: int, eval_every: int, seed: int, trl_generation: str) -> SharedWork:
    """The experiment's GRPO work as both frameworks run it."""
    if not cfg.data.source.startswith("builtin:"):
        raise UserError(f"data.source: {cfg.data.source!r} is not a built-in task; trl_curve needs one (both "
                        "sides draw the same train and held-out rows from it)")
    if eval_every <= 0 or steps % eval_every:
        raise UserError(f"--eval-every: {eval_every} must be positive and divide --steps {steps}")
    reward = TRL_REWARDS.get(cfg.reward.fn)
    if reward is None:
        raise UserError(f"reward.fn: {cfg.reward.fn!r} has no TRL counterpart here; use one of {sorted(TRL_REWARDS)}")
    work = SharedWork(
        model_dir=cfg.model.path, prompts=cfg.data.train_batch_size,
        samples_per_prompt=cfg.rollout.n_samples_per_prompt,
        response_length=cfg.rollout.max_new_tokens, mini_batch_size=cfg.algorithm.mini_batch_size,
        micro_batch_size=cfg.roles.actor.micro_batch_size, ppo_epochs=cfg.algorithm.ppo_epochs, lr=cfg.trainer.lr,
        kl_coef=cfg.algorithm.kl_coef, cliprange=cfg.algorithm.cliprange, temperature=cfg.rollout.temperature,
        warmup_steps=0, steps=steps, seed=seed, task=cfg.data.source, reward=reward, stop_at_eos=True,
        eval_every=eval_every, eval_rows=cfg.data.val_size, trl_generation=trl_generation,
        max_prompt_length=cfg.data.max_prompt_length)
    work.check()
    return work


def hybridflow_command(experiment: str, work: SharedWork, run_dir: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "hybridflow.run", f"+experiment={experiment}", f"trainer.seed={work.seed}",
            f"trainer.total_steps={work.steps}", f"trainer.val_every={work.eval_every}",
            "trainer.val_before_train=true", "trainer.save_every=0", f"trainer.output_dir={run_dir}",
            f"distributed.master_port={free_port()}", *extra]


def hybridflow_result(run_dir: Path, work: SharedWork) -> dict:
    """Throughput over every RL step but the first (its CUDA graphs and allocator warm up), and the val curve."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rl = read_rl_records(run_dir / "metrics.jsonl")[1:]
    tokens = [hybridflow_step_tokens(r, work.samples) for r in rl]
    accuracy = [{"step": r["step"], "samples": r["step"] * work.samples, "accuracy": r["val/accuracy"]}
                for r in lines if r.get("phase") == "val"]
    return {"timed_steps": len(rl), **rates(tokens, [r["step_time_s"] for r in rl], work.samples),
            "accuracy": accuracy}


def run_seed(args: argparse.Namespace, cfg: ExperimentConfig, extra: list[str], seed: int, out: Path) -> dict:
    """One seed's runs: {"hybridflow-<engine>": ..., "trl": ...} for the sides asked for."""
    steps = args.steps or cfg.trainer.total_steps
    work = shared_work(cfg, steps, args.eval_every or cfg.trainer.val_every, seed, args.trl_generation)
    result: dict = {"seed": seed, "work": asdict(work)}
    sides = args.sides.split(",")
    if "hybridflow" in sides:
        name = side_name(cfg.rollout.engine, args.label)
        run_dir = out / f"{name}_s{seed}"
        cmd = hybridflow_command(args.experiment, work, run_dir, extra)
        print(f"{name}:", " ".join(cmd[1:]), flush=True)
        shutil.rmtree(run_dir, ignore_errors=True)  # a failed earlier try would add its records to metrics.jsonl
        subprocess.run(cmd, cwd=REPO_ROOT, check=True)
        variant = f", {args.label}" if args.label else ""
        result[name] = {"command": " ".join(cmd[1:]), **hybridflow_result(run_dir, work),
                        "framework": f"hybridflow ({cfg.rollout.engine} rollout{variant})"}
    if "trl" in sides:
        spec = out / f"trl_spec_s{seed}.json"
        spec.write_text(json.dumps(asdict(work), indent=2))
        print(f"trl: seed {seed}", flush=True)
        subprocess.run([sys.executable, "-m", "benchmarks.trl_grpo", "--spec", str(spec),
                        "--out", str(out / f"trl_s{seed}.json")], cwd=REPO_ROOT, check=True)
        result["trl"] = json.loads((out / f"trl_s{seed}.json").read_text())
    return result


def side_name(engine: str, label: str = "") -> str:
    """hybridflow's side in compare.json: its engine, and the variant's --label if any."""
    return f"hybridflow-{engine}" + (f"-{label}" if label else "")


def sides_of(run: dict) -> list[str]:
    return sorted(k for k in run if k.startswith("hybridflow-")) + (["trl"] if "trl" in run else [])


def compare_markdown(meta: dict, runs: list[dict]) -> str:
    w = runs[0]["work"]
    lines = [f"# hybridflow vs TRL GRPO on a real task, {meta['device']}, {meta['date']}, commit {meta['commit']}", "",
             f"model {w['model_dir']}, task {w['task']}: {w['prompts']} prompts x {w['samples_per_prompt']} samples, "
             f"<= {w['response_length']} response tokens (eos stops), mini-batch {w['mini_batch_size']}, "
             f"micro-batch {w['micro_batch_size']}, lr {w['lr']}, KL {w['kl_coef']}, {w['steps']} RL steps, "
             f"greedy held-out accuracy on {w['eval_rows']} prompts every {w['eval_every']} steps", "",
             "Tokens: prompt + response tokens per RL step, padding not counted, one counter for both sides "
             "(benchmarks/token_count.py).", "",
             "| seed | framework | tokens/s | samples/s | step s | tokens/step | accuracy before -> after |",
             "|---|---|---|---|---|---|---|"]
    for run in runs:
        for name in sides_of(run):
            r, acc = run[name], run[name].get("accuracy", [])
            curve = f"{acc[0]['accuracy']:.3f} -> {acc[-1]['accuracy']:.3f}" if acc else "-"
            lines.append(f"| {run['seed']} | {r['framework']} | {r['throughput_tokens_per_s']:,.0f} | "
                         f"{_samples_per_s(r, w):,.1f} | {r['step_time_s']:.2f} | {_tokens_per_step(r)} | {curve} |")
        for name in sides_of(run)[:-1] if "trl" in run else []:
            h, t = run[name], run["trl"]
            tokens = h["throughput_tokens_per_s"] / t["throughput_tokens_per_s"]
            lines.append(f"| {run['seed']} | {name} / TRL | **{tokens:.2f}x** | "
                         f"**{_samples_per_s(h, w) / _samples_per_s(t, w):.2f}x** | "
                         f"{h['step_time_s'] / t['step_time_s']:.2f}x | | |")
    return "\n".join(lines) + "\n"


def _samples_per_s(r: dict, work: dict) -> float:
    """Samples per second (results written before samples/s was recorded: samples per step / step time)."""
    return r.get("samples_per_s") or work["prompts"] * work["samples_per_prompt"] / r["step_time_s"]


def _tokens_per_step(r: dict) -> str:
    return f"{r['tokens_per_step']:,.0f}" if "tokens_per_step" in r else "-"


def plot_accuracy(runs: list[dict], path: Path) -> None:
    """accuracy.png: held-out accuracy against samples trained on, one line per framework and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        for name in sides_of(run):
            acc = run[name].get("accuracy", [])
            if acc:
                ax.plot([a["samples"] for a in acc], [a["accuracy"] for a in acc], "--s" if name == "trl" else "-o",
                        label=f"{name} seed {run['seed']}")
    ax.set_xlabel("samples trained on")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    with cli_errors():
        args, extra = parse_args(sys.argv[1:] if argv is None else argv)
        out = args.out.resolve()
        cfg = resolve_experiment(args.experiment, extra)
        seeds = [int(s) for s in args.seeds.split(",")]
        if args.dry_run:
            work = shared_work(cfg, args.steps or cfg.trainer.total_steps, args.eval_every or cfg.trainer.val_every,
                               seeds[0], args.trl_generation)
            print(json.dumps({"work": asdict(work), "hybridflow_command": hybridflow_command(
                args.experiment, work, out / f"{side_name(cfg.rollout.engine, args.label)}_s{seeds[0]}", extra)[1:],
                "grpo_config": grpo_config_kwargs(replace(work), str(out / "trl_output"), on_gpu=False)},
                indent=2, default=str))
            return 0
        out.mkdir(parents=True, exist_ok=True)
        # Sides run in separate invocations (e.g. one per engine) add to the same compare.json, per seed.
        previous = json.loads((out / "compare.json").read_text())["runs"] if (out / "compare.json").exists() else []
        by_seed = {run["seed"]: run for run in previous}
        for seed in seeds:
            by_seed[seed] = {**by_seed.get(seed, {}), **run_seed(args, cfg, extra, seed, out)}
            runs = [by_seed[s] for s in sorted(by_seed)]
            meta = provenance()
            (out / "compare.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2))
            (out / "compare.md").write_text(compare_markdown(meta, runs))
            plot_accuracy(runs, out / "accuracy.png")
        print(compare_markdown(provenance(), runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
