"""Sampling and precision checks behind issue #43 (why hybridflow's policy starts at a higher entropy and moves less).

    python -m benchmarks.sampling_check [--prompts 8 --response-length 48 --draws 20000 --json out.json]

On SmolLM2-135M-Instruct (the packaged checkpoint, fp32 on CPU) and real gsm8k_easy chat prompts:

1. sampler: the native engine's `sample_next` at temperature 1, top-k / top-p off (the grpo_smollm2 settings)
   against softmax of the same logits: the total-variation distance of `--draws` draws per row from softmax,
   next to the distance a true softmax sampler (torch.multinomial) gets with as many draws, and the log-prob it
   returns against log_softmax.
2. precision: the mean per-token entropy over sampled responses (eos in the mask, as both trainers count it)
   with fp32 weights, with the weights in pure bf16 (megatron's bf16 model: hybridflow's actor, reference and
   native rollout) and with fp32 weights under bf16 autocast (TRL's training forward with `bf16=True`).
3. bf16 visibility of small updates: the share of each parameter kind's elements whose bf16 value moves after
   k Adam-sized steps of lr (each element moves by lr per optimizer step, the size of Adam's early steps):
   hybridflow's forward sees only the bf16 copy of its fp32 master weights, TRL's autocast forward sees fp32
   norms and embeddings and bf16 casts of the matmul weights.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--response-length", type=int, default=48)
    p.add_argument("--draws", type=int, default=4096)
    p.add_argument("--lr", type=float, default=3e-6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


CHUNK = 256


def total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return float(0.5 * (counts / counts.sum() - probs).abs().sum())


def sampler_check(logits: torch.Tensor, draws: int, seed: int) -> dict:
    """TV distance of sample_next's draws and of torch.multinomial's from softmax(logits), per row (max)."""
    from hybridflow.rollout.base import SamplingParams
    from hybridflow.rollout.sampling import sample_next

    sampling = SamplingParams(max_new_tokens=1, temperature=1.0, top_p=1.0, top_k=0)
    gen = torch.Generator().manual_seed(seed)
    probs = logits.float().softmax(-1)
    ours, reference, logp_err = [], [], 0.0
    for row in range(logits.shape[0]):
        parts = [sample_next(logits[row : row + 1].expand(min(CHUNK, draws - i), -1), sampling, gen)
                 for i in range(0, draws, CHUNK)]  # chunks: a [draws, vocab] work tensor would be GiBs
        tokens, logp = torch.cat([t for t, _ in parts]), torch.cat([lp for _, lp in parts])
        ours.append(total_variation(torch.bincount(tokens, minlength=probs.shape[1]).float(), probs[row]))
        want = torch.log_softmax(logits[row].float(), -1)[tokens]
        logp_err = max(logp_err, float((logp - want).abs().max()))
        ref = torch.multinomial(probs[row], draws, replacement=True, generator=gen)
        reference.append(total_variation(torch.bincount(ref, minlength=probs.shape[1]).float(), probs[row]))
    return {"tv_sample_next_max": max(ours), "tv_multinomial_max": max(reference),
            "tv_sample_next_mean": sum(ours) / len(ours), "tv_multinomial_mean": sum(reference) / len(reference),
            "logprob_max_abs_err": logp_err}


def mean_entropy(model, tokens: torch.Tensor, mask: torch.Tensor, autocast: bool = False) -> float:
    """Token-mean entropy of the next-token distribution at each masked response position."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(tokens).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1)
    ent = -(logp.exp() * logp).sum(-1)
    m = mask[:, 1:]
    return float((ent * m).sum() / m.sum())


def update_visibility(model, lr: float, steps: tuple[int, ...] = (1, 10, 80)) -> dict:
    """Share of elements whose bf16 value changes after k steps of +lr, per parameter kind."""
    kinds: dict[str, list[torch.Tensor]] = {}
    for name, p in model.named_parameters():
        kind = "norm" if "norm" in name else "embedding" if "embed" in name else "matmul"
        kinds.setdefault(kind, []).append(p.detach().float().flatten())
    out = {}
    for kind, tensors in kinds.items():
        w = torch.cat(tensors)
        base = w.to(torch.bfloat16)
        out[kind] = {"elements": w.numel(), "median_abs": float(w.abs().median())}
        for k in steps:
            moved = (w + k * lr).to(torch.bfloat16) != base
            out[kind][f"moved_after_{k}"] = float(moved.float().mean())
    return out


def smollm2_chat(prompts: int, seed: int, samples: int = 1):
    """(checkpoint dir, tokenizer, fp32 model in eval mode, left-padded encoding) of SmolLM2-135M-Instruct (the
    packaged checkpoint) and `prompts` gsm8k_easy chat prompts, each repeated `samples` times."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.convert.packaged_model import packaged_checkpoint
    from hybridflow.data.tasks import builtin_task, task_rows

    src = packaged_checkpoint("smollm2_135m")
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    rows = task_rows(builtin_task("builtin:gsm8k_easy"), prompts, seed)
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    tok.padding_side = "left"
    enc = tok([t for t in texts for _ in range(samples)], return_tensors="pt", padding=True, add_special_tokens=False)
    return src, tok, model, enc


def sampled_responses(model, tok, enc, max_new_tokens: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(prompt ids without padding, response ids up to and with the first eos) of each row of `enc`, sampled by HF
    generate at temperature 1, top-k / top-p off."""
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
    comp = out[:, enc["input_ids"].shape[1]:]
    ended = (comp == tok.eos_token_id).long().cumsum(1)
    keep = (ended == 0) | ((ended == 1) & (comp == tok.eos_token_id))  # up to and with the first eos
    return [(p[m.bool()], r[k]) for p, m, r, k in zip(enc["input_ids"], enc["attention_mask"], comp, keep,
                                                       strict=True)]


def main(argv=None) -> dict:
    args = parse_args(argv)
    from transformers import AutoModelForCausalLM

    src, tok, model, enc = smollm2_chat(args.prompts, args.seed)
    with torch.no_grad():
        last = model(**enc).logits[:, -1]
    result = {"sampler": sampler_check(last, args.draws, args.seed)}
    # one sample per row without left padding: re-pack each row as prompt + response from column 0
    seqs, masks = [], []
    for p, r in sampled_responses(model, tok, enc, args.response_length, args.seed):
        seqs.append(torch.cat([p, r]))
        masks.append(torch.cat([torch.zeros(len(p)), torch.ones(len(r))]))
    entropies = {}
    for seq, mask in zip(seqs, masks, strict=True):
        for name, m, auto in (("fp32", model, False), ("autocast_bf16 (TRL bf16=True)", model, True)):
            entropies.setdefault(name, []).append(mean_entropy(m, seq[None], mask[None], auto))
    bf16 = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()
    for seq, mask in zip(seqs, masks, strict=True):
        entropies.setdefault("pure_bf16 (hybridflow)", []).append(mean_entropy(bf16, seq[None], mask[None]))
    tokens = [int(m.sum()) for m in masks]
    result["entropy_token_mean"] = {k: sum(e * n for e, n in zip(v, tokens, strict=True)) / sum(tokens)
                                    for k, v in entropies.items()}
    result["response_tokens"] = sum(tokens)
    result["bf16_update_visibility"] = update_visibility(model, args.lr)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
