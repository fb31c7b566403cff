"""One GRPO batch through TRL 1.16's GRPOTrainer and through hybridflow's RLTrainer, on CPU (issue #43, item 3).

    PYTHONPATH=.:/path/to/trl-site python -m benchmarks.grpo_loss_parity [--layers 4 --prompts 4 --group 4
        --mini-batch 8 --micro-batch 4 --response-length 24 --json out.json]

The same batch (SmolLM2-135M-Instruct's first `--layers` layers, real gsm8k_easy chat prompts, responses
sampled by transformers at temperature 1 ending at eos, fixed 0/1 rewards, old log-probs = the model's own,
reference log-probs from a perturbed copy so the KL term is not zero) goes through:

- TRL: `GRPOTrainer.train()` itself at benchmarks/trl_grpo.py's mapping (loss_type dapo, beta = kl_coef with
  TRL's k3 KL, epsilon 0.2, scale_rewards as TRL's default, num_iterations 1, GA = mini / micro, HF AdamW,
  max_grad_norm 1.0, constant lr), with `_generate_and_score_completions` replaced by one that returns the
  batch (its rewards normalised by TRL's own code path for advantages is not reachable without generation,
  so the advantages are TRL's formula, (r - group mean) / (group std + 1e-4), checked against ours) and the
  generation batch not shuffled (TRL shuffles it before cutting mini-batches; hybridflow keeps its order).
- hybridflow: `RLTrainer.assign_rewards` + the GRPO estimator (advantages) and `RLTrainer._update` (loss_agg,
  megatron's schedule, megatron Adam + clipping + OptimizerParamScheduler) on a one-rank gloo world, with the
  grpo_smollm2 experiment's algorithm config (mini/micro batch and lr as given).

Printed and returned: advantages, per-mini-batch pre-clip gradient norms, the per-parameter relative error of
each optimizer step's gradient (hybridflow pre-clip vs TRL pre-clip), of the parameter update after each
optimizer step, the update sizes, and the lr each side applied.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EXPERIMENT = "grpo_smollm2"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4, help="SmolLM2 layers kept (30 = the whole model)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4, help="samples per prompt")
    p.add_argument("--mini-batch", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--response-length", type=int, default=24)
    p.add_argument("--lr", type=float, default=3e-6)
    p.add_argument("--kl-coef", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hybridflow-advantages", action="store_true",
                   help="give TRL hybridflow's advantages (eps 1e-6) instead of its own formula's (eps 1e-4), so the "
                        "remaining difference is the loss and optimizer path alone")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def truncated_checkpoint(layers: int, out: Path) -> Path:
    """SmolLM2-135M-Instruct (the packaged GGUF, converted by hybridflow) cut to its first `layers` layers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.convert.packaged_model import packaged_checkpoint

    src = packaged_checkpoint("smollm2_135m")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def make_batch(model_dir: Path, args) -> dict:
    """Prompts (chat-templated gsm8k_easy rows), sampled responses (ending at eos, which is in the mask as TRL
    counts it), 0/1 rewards with every group mixed, old log-probs and perturbed-reference log-probs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.data.tasks import builtin_task, task_rows

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = task_rows(builtin_task("builtin:gsm8k_easy"), args.prompts, args.seed)
    prompts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True) for r in rows]
    prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in prompts]
    torch.manual_seed(args.seed)
    samples = []  # (prompt ids, completion ids)
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=args.response_length, num_return_sequences=args.group,
                             pad_token_id=tok.eos_token_id)
        for row in out[:, len(p):].tolist():
            if tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id) + 1]
            samples.append((p, row))
    gen = torch.Generator().manual_seed(args.seed + 1)
    rewards = torch.zeros(len(samples))
    for g in range(args.prompts):  # each group gets 1..group-1 correct answers: none has zero std
        k = int(torch.randint(1, args.group, (), generator=gen))
        rewards[g * args.group + torch.randperm(args.group, generator=gen)[:k]] = 1.0
    # hybridflow's layout: prompt from column 0, response after it, right padding
    width = max(len(p) + len(c) for p, c in samples)
    tokens = torch.full((len(samples), width), tok.eos_token_id)
    mask = torch.zeros(len(samples), width)
    for i, (p, c) in enumerate(samples):
        tokens[i, : len(p) + len(c)] = torch.tensor(p + c)
        mask[i, len(p) : len(p) + len(c)] = 1.0
    old = hf_logprobs(model, tokens, mask)
    torch.manual_seed(args.seed + 2)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02 * param.std())
    ref = hf_logprobs(model, tokens, mask)
    return {"samples": samples, "rewards": rewards, "tokens": tokens, "mask": mask, "old": old, "ref": ref,
            "pad_id": tok.eos_token_id}


@torch.no_grad()
def hf_logprobs(model, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Column t: log p(tokens[t] | tokens[:t]) under `model` (0 where mask is 0)."""
    logits = model(tokens, attention_mask=torch.ones_like(tokens)).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, tokens[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros(len(tokens), 1), lp], 1) * mask


def trl_inputs(batch: dict) -> dict:
    """The dict `_generate_and_score_completions` returns, in TRL's layout (left-padded prompts, right-padded
    completions, per-completion-token log-probs), advantages by TRL's formula."""
    samples, pad = batch["samples"], batch["pad_id"]
    n = len(samples)
    plen = max(len(p) for p, _ in samples)
    clen = max(len(c) for _, c in samples)
    prompt_ids, prompt_mask = torch.full((n, plen), pad), torch.zeros(n, plen, dtype=torch.long)
    comp_ids, comp_mask = torch.full((n, clen), pad), torch.zeros(n, clen, dtype=torch.long)
    old, ref = torch.zeros(n, clen), torch.zeros(n, clen)
    for i, (p, c) in enumerate(samples):
        prompt_ids[i, plen - len(p):], prompt_mask[i, plen - len(p):] = torch.tensor(p), 1
        comp_ids[i, : len(c)], comp_mask[i, : len(c)] = torch.tensor(c), 1
        old[i, : len(c)] = batch["old"][i, len(p) : len(p) + len(c)]
        ref[i, : len(c)] = batch["ref"][i, len(p) : len(p) + len(c)]
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": comp_ids,
            "completion_mask": comp_mask, "advantages": trl_advantages(batch["rewards"], len(samples) // len(
                {tuple(p) for p, _ in samples})), "num_items_in_batch": comp_mask.sum(),
            "old_per_token_logps": old, "ref_per_token_logps": ref}


def trl_advantages(rewards: torch.Tensor, group: int) -> torch.Tensor:
    """TRL 1.16's group advantages (grpo_trainer.py, scale_rewards="group"): (r - mean) / (nanstd + 1e-4)."""
    from trl.trainer.utils import nanstd

    grouped = rewards.view(-1, group)
    mean = grouped.mean(1).repeat_interleave(group)
    std = nanstd(grouped, dim=1).repeat_interleave(group)
    return (rewards - mean) / (std + 1e-4)


def run_trl(model_dir: Path, batch: dict, args, out_dir: Path) -> dict:
    """TRL's own training loop over the batch: grads before clipping, lr and weights after each optimizer step."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer import grpo_trainer

    from benchmarks.trl_grpo import SharedWork, grpo_config_kwargs

    work = SharedWork(model_dir=str(model_dir), prompts=args.prompts, samples_per_prompt=args.group,
                      response_length=args.response_length, mini_batch_size=args.mini_batch,
                      micro_batch_size=args.micro_batch, ppo_epochs=1, lr=args.lr, kl_coef=args.kl_coef,
                      cliprange=0.2, temperature=1.0, warmup_steps=0, steps=1, seed=args.seed, stop_at_eos=True,
                      trl_generation="hf")
    kwargs = grpo_config_kwargs(work, str(out_dir), on_gpu=False)
    inputs = trl_inputs(batch)
    if args.hybridflow_advantages:
        from hybridflow.algorithms.advantages.group_norm import group_normalized_scores

        inputs["advantages"] = group_normalized_scores(batch["rewards"], args.group)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    record: dict = {"grads": [], "weights": [], "lr": [], "grad_norm": []}

    class Snap(TrainerCallback):
        def on_step_end(self, a, state, control, model=None, **kw):
            record["weights"].append({n: p.detach().clone() for n, p in model.named_parameters()})
            record["lr"].append(trainer.lr_scheduler.get_last_lr()[0])

    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                          args=GRPOConfig(**kwargs), processing_class=tok, callbacks=[Snap()],
                          train_dataset=Dataset.from_list([{"prompt": "x"}] * args.prompts))
    trainer._generate_and_score_completions = lambda _inputs: dict(inputs)
    clip = trainer.accelerator.clip_grad_norm_

    def snap_then_clip(params, max_norm, *a, **k):
        params = list(params)
        record["grads"].append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        norm = clip(params, max_norm, *a, **k)
        record["grad_norm"].append(float(norm))
        return norm

    trainer.accelerator.clip_grad_norm_ = snap_then_clip
    shuffle = grpo_trainer.shuffle_sequence_dict
    grpo_trainer.shuffle_sequence_dict = lambda d: d  # hybridflow keeps the batch's order (see the docstring)
    try:
        trainer.train()
    finally:
        grpo_trainer.shuffle_sequence_dict = shuffle
    record["initial"] = {n: p.detach().clone() for n, p in
                         AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).named_parameters()}
    record["advantages"] = inputs["advantages"]
    record["log"] = [h for h in trainer.state.log_history if "entropy" in h or "kl" in h]
    return record


def hf_named(model, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """megatron tensors (keyed like the model's parameters) under the HF checkpoint's names."""
    from megatron_adapters.hf_safetensors import stage_entries
    from megatron_adapters.hf_weights import mcore_full_to_hf

    out = {}
    for entry, name in stage_entries(model):
        if not entry.tied:
            out.update(mcore_full_to_hf(entry, tensors[name], model.hf_shape, 1))
    return out


def run_hybridflow(model_dir: Path, batch: dict, args) -> dict:
    """RLTrainer's advantages and `_update` on a one-rank world, the grpo_smollm2 recipe's algorithm config."""
    from benchmarks.actor_mfu import init_single_process
    from hybridflow.algorithms import build_algorithm, build_kl_controller
    from hybridflow.config import load_experiment
    from hybridflow.data.step_batch import StepBatch
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import build_model_role
    from hybridflow.token_kinds import TokenKind, prompt_kinds
    from hybridflow.trainer.build import optimizer_settings
    from hybridflow.trainer.rl_trainer import RLTrainer
    from megatron_adapters.checkpoint import unwrap
    from megatron_adapters.process_groups import build_role_groups

    init_single_process()
    cfg = load_experiment(EXPERIMENT, [
        "model.packaged=null", f"model.path={model_dir}", f"data.tokenizer={model_dir}",
        f"model.num_hidden_layers={args.layers}",
        f"algorithm.mini_batch_size={args.mini_batch}", f"roles.actor.micro_batch_size={args.micro_batch}",
        f"rollout.n_samples_per_prompt={args.group}", f"data.train_batch_size={args.prompts}",
        f"trainer.lr={args.lr}", f"algorithm.kl_coef={args.kl_coef}"])
    groups = build_role_groups([0], tp=1, pp=1, dp=1)
    mesh = RoleMesh("actor", (0,), ParallelDims(1, 1, 1))
    actor = build_model_role("actor", mesh, groups, str(model_dir), "lm", torch.float32, args.micro_batch,
                             optimizer=optimizer_settings(cfg, "actor", 0), seed=0)
    alg = cfg.algorithm
    trainer = RLTrainer(cfg=cfg, roles={"actor": actor}, meshes={"actor": mesh, "ref": mesh}, rollout=None,
                        scorer=None, kl_ctl=build_kl_controller(alg.kl_controller, alg.kl_coef, alg.kl_target,
                                                                alg.kl_horizon),
                        algorithm=build_algorithm(cfg), device=torch.device("cpu"), training=None)
    n, n_cols = len(batch["samples"]), batch["tokens"].shape[1]
    prompt_lens = torch.tensor([len(p) for p, _ in batch["samples"]])
    assistant = torch.where(batch["mask"].bool(), int(TokenKind.ASSISTANT), prompt_kinds(prompt_lens, n_cols))
    step = StepBatch(rows=[{}] * n, tokens=batch["tokens"], prompt_lens=prompt_lens, token_kinds=assistant)
    step.scores, step.old_logprobs, step.ref_logprobs = batch["rewards"], batch["old"], batch["ref"]
    trainer.assign_rewards(step)  # as RLTrainer.consume: token rewards, then the estimator
    step.advantages = trainer.algorithm.estimator(step.token_rewards, step.loss_mask, step.values).advantages
    gpt = unwrap(actor.model)
    record: dict = {"grads": [], "weights": [], "lr": [], "grad_norm": []}
    record["initial"] = hf_named(gpt, {n: p.detach().clone() for n, p in gpt.named_parameters()})
    opt_step = actor.optimizer.step

    def snapped_step():
        record["grads"].append(hf_named(gpt, {n: p.main_grad.detach().clone().view_as(p)
                                              for n, p in gpt.named_parameters()}))
        stats = opt_step()
        record["weights"].append(hf_named(gpt, {n: p.detach().clone() for n, p in gpt.named_parameters()}))
        record["lr"].append(stats["lr"])
        record["grad_norm"].append(stats["grad_norm"])
        return stats

    actor.optimizer.step = snapped_step
    record["metrics"] = trainer._update("actor", step, trainer._actor_loss(cfg.rollout.temperature or 1.0),
                                        trainer._actor_fields())
    rows = step.loss_mask.sum(1) > 0
    first = step.loss_mask.float().argmax(1)
    record["advantages"] = step.advantages[torch.arange(n), first] * rows
    record["config"] = {"loss_agg_mode": alg.loss_agg_mode, "whiten_advantages": alg.whiten_advantages,
                        "kl_loss_estimator": alg.kl_loss_estimator, "entropy_coef": alg.entropy_coef,
                        "grad_clip": cfg.trainer.grad_clip, "weight_decay": cfg.trainer.weight_decay}
    return record


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b| (Frobenius)."""
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def compare(hf: dict, trl: dict, pad_id: int) -> dict:
    """The figures that decide parity: advantages, each step's gradient and update, per parameter."""
    names = sorted(trl["initial"])
    missing = [n for n in names if n not in hf["initial"]]
    names = [n for n in names if n in hf["initial"]]
    out = {"advantages_max_abs_diff": float((hf["advantages"] - trl["advantages"]).abs().max()),
           "lr_hybridflow": hf["lr"], "lr_trl": trl["lr"],
           "grad_norm_hybridflow": hf["grad_norm"], "grad_norm_trl": trl["grad_norm"],
           "not_compared": missing, "config_hybridflow": hf.get("config"), "metrics_hybridflow": hf.get("metrics"),
           "trl_log": trl.get("log"),
           "initial_weights_max_rel_err": max(rel_err(hf["initial"][n], trl["initial"][n]) for n in names),
           "steps": []}
    embed = "model.embed_tokens.weight"
    for k in range(min(len(hf["grads"]), len(trl["grads"]))):
        if embed in names:  # which vocabulary rows carry the embedding's difference
            rows = (hf["grads"][k][embed] - trl["grads"][k][embed]).norm(dim=1)
            # HF builds the embedding with padding_idx = pad_token_id (SmolLM2: 2, <|im_end|>, also its eos),
            # so the lookup part of that row's gradient is 0 on TRL's side; megatron has no padding_idx
            keep = torch.ones(rows.numel(), dtype=torch.bool)
            keep[pad_id] = False
            out.setdefault("embed_grad_rel_err_without_pad_row", []).append(
                rel_err(hf["grads"][k][embed][keep], trl["grads"][k][embed][keep]))
            top = rows.topk(5)
            out.setdefault("embed_grad_diff_rows", []).append({
                "token_ids": top.indices.tolist(), "share_of_diff": float(top.values.norm() / rows.norm()),
                "row_rel_err": [rel_err(hf["grads"][k][embed][i], trl["grads"][k][embed][i])
                                for i in top.indices.tolist()]})
        out.setdefault("grad_rel_err_by_param", []).append(
            {n: rel_err(hf["grads"][k][n], trl["grads"][k][n]) for n in names})
        grad = {n: rel_err(hf["grads"][k][n], trl["grads"][k][n]) for n in names if n != embed}
        du_h = {n: hf["weights"][k][n] - hf["initial"][n] for n in names}
        du_t = {n: trl["weights"][k][n] - trl["initial"][n] for n in names}
        upd = {n: rel_err(du_h[n], du_t[n]) for n in names}
        norm = {side: float(torch.sqrt(sum(d[n].double().pow(2).sum() for n in names)))
                for side, d in (("hybridflow", du_h), ("trl", du_t))}
        grad_scale = float(torch.sqrt(sum(hf["grads"][k][n].double().pow(2).sum() for n in names)) /
                           torch.sqrt(sum(trl["grads"][k][n].double().pow(2).sum() for n in names)))
        out["steps"].append({
            "grad_max_rel_err_but_embedding": max(grad.values()),
            "grad_median_rel_err": sorted(grad.values())[len(grad) // 2], "grad_worst": max(grad, key=grad.get),
            "grad_norm_ratio_hybridflow_over_trl": grad_scale,
            "update_max_rel_err": max(upd.values()), "update_worst": max(upd, key=upd.get),
            "update_norm": norm, "update_norm_ratio_hybridflow_over_trl": norm["hybridflow"] / norm["trl"]})
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = truncated_checkpoint(args.layers, Path(tmp) / "model")
        batch = make_batch(model_dir, args)
        trl = run_trl(model_dir, batch, args, Path(tmp) / "trl")
        hf = run_hybridflow(model_dir, batch, args)
    result = compare(hf, trl, batch["pad_id"])
    result["batch"] = {"samples": len(batch["samples"]), "response_tokens": int(batch["mask"].sum()),
                       "rewards": batch["rewards"].tolist(), "layers": args.layers}
    print(json.dumps(result, indent=2, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    main()
