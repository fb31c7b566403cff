"""How far the GRPO policy gradient under bf16 lands from the fp32 one, next to half-batch sampling noise (CPU).

    PYTHONPATH=. python -m benchmarks.precision_gradient [--prompts 4 --samples 4 --response-length 48 --seed 0
                                                          --layers K --threads 2 --json out.json]

On SmolLM2-135M-Instruct (the packaged checkpoint, fp32 weights) and `--prompts` gsm8k_easy chat prompts with
`--samples` responses each (HF generate at temperature 1, eos in the response mask):

1. advantages: GRPO per group, (r - group mean) / (group std + 1e-6) (unbiased std, as TRL), r the 0/1
   `hybridflow.rewards.gsm8k` score of the decoded response; when no group of one of the two half batches has
   reward spread (no signal to compare), the rewards are replaced by 1, 0, 1, 0, ... within each group (so the
   advantages alternate +/-); `advantages.source` in the output says which was used.
2. loss: the on-policy GRPO surrogate at ratio 1 with a token mean over all response tokens of the batch
   ("dapo" normalisation), -(adv * logp * mask).sum() / mask.sum(), logp = log_softmax(logits.float()) at the
   next token; no KL. One micro-batch per group, gradients accumulated in fp32 (megatron's
   grad_reduce_in_fp32=True main_grad buffers).
3. the gradient of that loss for the SAME fp32 weights under three precisions:
   - `fp32` (reference): fp32 weights, fp32 compute;
   - `autocast_bf16` (TRL bf16=True): fp32 weights under torch.autocast("cpu", bfloat16): matmuls in bf16,
     residual stream, RMSNorm gains and embedding lookups in fp32;
   - `pure_bf16` (hybridflow's megatron bf16 model): a copy cast to bf16, residual stream in bf16, its bf16
     gradients read back as fp32.
4. per precision against the reference, overall and per parameter kind (matmul weights / norm gains /
   embedding, the tied lm head included; the split of sampling_check.update_visibility): cosine of the
   gradients, relative L2 error ||g - g_ref|| / ||g_ref||, sign agreement among the elements whose |g_ref| is
   above the kind's median |g_ref| (Adam's first steps move each element by about lr * sign(g)), and the cosine
   of sign(g) with sign(g_ref) over all elements (agreement of a first Adam step); plus the max and mean
   |logp - logp_ref| over response tokens.
5. calibration: the same statistics between the fp32 gradients of the two halves of the groups (first half vs
   second half: sampling noise at half the batch), and of the first half against the full batch.

`--layers K` keeps only the first K decoder layers for the gradients (responses are still sampled by the full
model); the output's `layers` says how many were used.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.sampling_check import sampled_responses, smollm2_chat  # noqa: E402

KINDS = ("matmul", "norm", "embedding")
PRECISIONS = ("fp32", "autocast_bf16", "pure_bf16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--response-length", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=None, help="keep only the first K decoder layers")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


# ---------------------------------------------------------------- metrics (pure functions, unit-tested)


def param_kind(name: str) -> str:
    """'norm' | 'embedding' | 'matmul', the split of sampling_check.update_visibility."""
    return "norm" if "norm" in name else "embedding" if "embed" in name else "matmul"


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors read as flat vectors (fp64 sums); nan when either is all zero."""
    a, b = a.flatten().double(), b.flatten().double()
    denom = float(a.norm() * b.norm())
    return float(a @ b) / denom if denom > 0 else float("nan")


def relative_l2_error(g: torch.Tensor, ref: torch.Tensor) -> float:
    """||g - ref|| / ||ref|| (fp64); nan when ref is all zero."""
    g, ref = g.flatten().double(), ref.flatten().double()
    n = float(ref.norm())
    return float((g - ref).norm()) / n if n > 0 else float("nan")


def sign_agreement_counts(g: torch.Tensor, ref: torch.Tensor) -> tuple[int, int]:
    """(elements with sign(g) == sign(ref), elements counted) among those whose |ref| is above the median |ref|."""
    g, ref = g.flatten(), ref.flatten()
    mag = ref.abs()
    keep = mag > mag.median()
    return int((torch.sign(g[keep]) == torch.sign(ref[keep])).sum()), int(keep.sum())


def sign_agreement(g: torch.Tensor, ref: torch.Tensor) -> float:
    """Share of the elements above the median |ref| where sign(g) == sign(ref); nan when none is above it."""
    agree, total = sign_agreement_counts(g, ref)
    return agree / total if total else float("nan")


def sign_cosine(g: torch.Tensor, ref: torch.Tensor) -> float:
    """Cosine of sign(g) with sign(ref) over all elements: how alike the first Adam steps of the two are."""
    return cosine(torch.sign(g), torch.sign(ref))


def compare(g: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict:
    """Statistics of per-kind flat gradients `g` against `ref`, per kind and over all kinds (sign agreement over
    all kinds pools each kind's above-its-median elements)."""
    out: dict = {}
    agree_all = total_all = 0
    for kind in ref:
        agree, total = sign_agreement_counts(g[kind], ref[kind])
        agree_all, total_all = agree_all + agree, total_all + total
        out[kind] = {"cosine": cosine(g[kind], ref[kind]), "rel_l2_err": relative_l2_error(g[kind], ref[kind]),
                     "sign_agree_above_median": agree / total if total else float("nan"),
                     "sign_cosine": sign_cosine(g[kind], ref[kind])}
    g_all, ref_all = torch.cat([g[k] for k in ref]), torch.cat([ref[k] for k in ref])
    out["all"] = {"cosine": cosine(g_all, ref_all), "rel_l2_err": relative_l2_error(g_all, ref_all),
                  "sign_agree_above_median": agree_all / total_all if total_all else float("nan"),
                  "sign_cosine": sign_cosine(g_all, ref_all)}
    return out


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """GRPO advantages of a [groups, samples] reward tensor: (r - group mean) / (group std + 1e-6)."""
    return (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)


# ---------------------------------------------------------------- experiment


def build_batch(args: argparse.Namespace):
    """(fp32 model, tokens [N, T], attention mask, response mask, rewards [P, S], advantages [N], source)."""
    from hybridflow.data.tasks import builtin_task, task_rows
    from hybridflow.rewards.gsm8k import gsm8k_score

    _, tok, model, enc = smollm2_chat(args.prompts, args.seed, samples=args.samples)
    rows = task_rows(builtin_task("builtin:gsm8k_easy"), args.prompts, args.seed)  # the rows smollm2_chat used
    pairs = sampled_responses(model, tok, enc, args.response_length, args.seed)
    width = max(len(p) + len(r) for p, r in pairs)
    n = len(pairs)
    tokens = torch.full((n, width), tok.pad_token_id, dtype=torch.long)
    attn, mask = torch.zeros(n, width, dtype=torch.long), torch.zeros(n, width)
    for i, (p, r) in enumerate(pairs):  # right-padded prompt + response, response (with eos) masked in
        tokens[i, : len(p) + len(r)] = torch.cat([p, r])
        attn[i, : len(p) + len(r)] = 1
        mask[i, len(p) : len(p) + len(r)] = 1
    texts = [tok.decode(r, skip_special_tokens=True) for _, r in pairs]
    rewards = torch.tensor([gsm8k_score(t, rows[i // args.samples]["answer"]) for i, t in enumerate(texts)])
    rewards = rewards.view(args.prompts, args.samples)
    spread = rewards.std(1) > 0
    half = args.prompts // 2
    if bool(spread[:half].any()) and bool(spread[half:].any()):
        source, used = "gsm8k_reward", rewards
    else:
        source = "alternating_fallback (a half batch had no group with reward spread)"
        used = torch.tensor([float(j % 2 == 0) for j in range(args.samples)]).expand(args.prompts, -1)
    return model, tokens, attn, mask, rewards, group_advantages(used).flatten(), source


def truncate_layers(model, k: int) -> None:
    """Keep the first k decoder layers of a HF Llama-style causal LM."""
    model.model.layers = model.model.layers[:k]
    model.config.num_hidden_layers = k
    if getattr(model.config, "layer_types", None) is not None:
        model.config.layer_types = model.config.layer_types[:k]


def policy_gradient(model, tokens: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor,
                    groups: list[list[int]], half: int, autocast: bool) -> tuple[list[dict], torch.Tensor]:
    """([fp32 gradient sums of the first-half groups, of the second-half groups] by parameter name, per-token
    logp over response tokens in row order) of -(adv * logp * mask).sum() / mask.sum() (whole-batch token mean),
    one backward per group."""
    total = mask[:, 1:].sum()
    params = dict(model.named_parameters())
    sums = [{n: torch.zeros(p.shape) for n, p in params.items()} for _ in range(2)]
    logps = []
    for gi, rows in enumerate(groups):
        model.zero_grad(set_to_none=True)
        t, a, m = tokens[rows], attn[rows], mask[rows, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=t, attention_mask=a).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, t[:, 1:, None]).squeeze(-1)
        loss = -(adv[rows, None] * logp * m).sum() / total
        loss.backward()
        dest = sums[0 if gi < half else 1]
        for n, p in params.items():
            if p.grad is not None:
                dest[n] += p.grad.float()
        logps.append(logp.detach()[m.bool()])
    model.zero_grad(set_to_none=True)
    return sums, torch.cat(logps)


def by_kind(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Flat fp32 gradient per parameter kind, in KINDS order."""
    parts: dict[str, list[torch.Tensor]] = {}
    for name, g in grads.items():
        parts.setdefault(param_kind(name), []).append(g.flatten())
    return {k: torch.cat(parts[k]) for k in KINDS if k in parts}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.prompts < 2:
        raise SystemExit("--prompts must be at least 2 (the calibration compares two halves of the groups)")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model, tokens, attn, mask, rewards, adv, source = build_batch(args)
    sample_s = time.perf_counter() - start
    n_layers = len(model.model.layers)
    if args.layers is not None and args.layers < n_layers:
        truncate_layers(model, args.layers)
    groups = [list(range(g * args.samples, (g + 1) * args.samples)) for g in range(args.prompts)]
    half = args.prompts // 2
    tokens_half = [float(mask[: half * args.samples, 1:].sum()), float(mask[half * args.samples :, 1:].sum())]
    total = sum(tokens_half)

    grads, logps, seconds = {}, {}, {}
    ref_halves = None
    for name in PRECISIONS:
        m = copy.deepcopy(model).to(torch.bfloat16) if name == "pure_bf16" else model
        t0 = time.perf_counter()
        sums, logps[name] = policy_gradient(m, tokens, attn, mask, adv, groups, half, name == "autocast_bf16")
        seconds[name] = time.perf_counter() - t0
        grads[name] = by_kind({n: sums[0][n] + sums[1][n] for n in sums[0]})
        if name == "fp32":  # each half's own token mean: sum over its groups / its tokens
            ref_halves = [by_kind({n: s[n] * (total / tokens_half[i]) for n in s}) for i, s in enumerate(sums)]
        del sums, m

    ref = grads["fp32"]
    result: dict = {
        "model": "SmolLM2-135M-Instruct (packaged checkpoint)",
        "layers": args.layers if args.layers is not None and args.layers < n_layers else n_layers,
        "prompts": args.prompts, "samples": args.samples, "response_length": args.response_length,
        "seed": args.seed, "threads": args.threads,
        "sequence_width": tokens.shape[1], "response_tokens": int(total), "response_tokens_per_half": tokens_half,
        "advantages": {"source": source, "rewards": rewards.tolist(),
                       "groups_with_reward_spread": int((rewards.std(1) > 0).sum())},
        "grad_norm_fp32": {k: float(v.double().norm()) for k, v in ref.items()},
        "vs_fp32": {}, "logp_abs_err": {},
    }
    for name in PRECISIONS[1:]:
        result["vs_fp32"][name] = compare(grads[name], ref)
        err = (logps[name] - logps["fp32"]).abs()
        result["logp_abs_err"][name] = {"max": float(err.max()), "mean": float(err.mean())}
    result["half_batch_noise_fp32"] = {"second_half_vs_first_half": compare(ref_halves[1], ref_halves[0]),
                                       "first_half_vs_full_batch": compare(ref_halves[0], ref)}
    result["seconds"] = {"sampling": sample_s, **{f"gradient_{k}": v for k, v in seconds.items()},
                         "total": time.perf_counter() - start}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
