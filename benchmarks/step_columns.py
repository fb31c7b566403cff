"""What one grpo_smollm2 step's model passes process, before and after the LM head at the loss tokens and the
length-sorted micro-batches: a count on a real step batch, not a timing.

    python -m benchmarks.step_columns [--prompts 32 --samples 8 --max-new-tokens 160 --seq-length 320 --json OUT]

SmolLM2-135M-Instruct (the packaged checkpoint, fp32, CPU, HF generate at temperature 1, top-k / top-p off, up to
and with the first eos) answers `--prompts` gsm8k_easy chat prompts `--samples` times each, laid out as the trainer
lays a step out (right-padded rows, the batch cut to its longest sample in 64-column steps). For the forward-only
passes (reference, old log-probs: 64-row micro-batches) and the update (mini-batches of 128 rows, micro-batches of
64), it counts the token positions the transformer body runs on and the positions the LM head and the
vocabulary-wide log-softmax / entropy run on, in row order at the batch's width (before) and through
`hybridflow.roles.micro_batching.padded_micro_batches` (after).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.sampling_check import sampled_responses, smollm2_chat
from hybridflow.config.data import TRIM_MULTIPLE
from hybridflow.data.step_batch import trimmed_width
from hybridflow.roles.micro_batching import padded_micro_batches


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_columns", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--seq-length", type=int, default=320, help="the widest a batch is cut to (data.seq_length)")
    p.add_argument("--micro-batch", type=int, default=64)
    p.add_argument("--mini-batch", type=int, default=128)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def sampled_batch(args) -> dict[str, torch.Tensor]:
    """input_ids, loss_mask and seq_lens [B] of one sampled step, right-padded to its width as the trainer cuts it."""
    _, tok, model, enc = smollm2_chat(args.prompts, args.seed, args.samples)
    seqs = sampled_responses(model, tok, enc, args.max_new_tokens, args.seed)
    lengths = [len(p) + len(r) for p, r in seqs]
    width = trimmed_width(max(lengths), TRIM_MULTIPLE, args.seq_length)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(seqs):
        ids[i, : len(p) + len(r)] = torch.cat([p, r])
        mask[i, len(p) : len(p) + len(r)] = 1
    return {"input_ids": ids, "loss_mask": mask, "seq_lens": torch.tensor(lengths)}


def count(tensors: dict[str, torch.Tensor], rows: int) -> dict[str, int]:
    """Body and head positions of one pass over `tensors` in micro-batches of `rows`, before and after."""
    before = {"body": tensors["input_ids"].numel(), "head": tensors["input_ids"].numel()}
    micro = padded_micro_batches(tensors, rows, torch.device("cpu"), logits_at_loss_tokens=True)
    after = {"body": sum(mb["input_ids"].numel() for mb in micro),
             "head": sum(mb["logit_positions"].shape[1] for mb in micro)}
    return {f"{k}_{when}": v for when, d in (("before", before), ("after", after)) for k, v in d.items()}


def main(argv=None) -> dict:
    args = parse_args(argv)
    batch = sampled_batch(args)
    b = batch["input_ids"].shape[0]
    update: dict[str, int] = {}
    for start in range(0, b, args.mini_batch):
        part = {k: v[start : start + args.mini_batch] for k, v in batch.items()}
        for k, v in count(part, args.micro_batch).items():
            update[k] = update.get(k, 0) + v
    result = {"rows": b, "width": batch["input_ids"].shape[1],
              "response_tokens": int(batch["loss_mask"].sum()),
              "mean_prompt": float((batch["seq_lens"] - batch["loss_mask"].sum(1)).float().mean()),
              "mean_response": float(batch["loss_mask"].sum(1).float().mean()),
              "forward_pass": count(batch, args.micro_batch), "update": update}
    for name in ("forward_pass", "update"):
        c = result[name]
        print(f"{name}: body {c['body_before']:,} -> {c['body_after']:,} positions "
              f"({c['body_after'] / c['body_before']:.2f}x), head {c['head_before']:,} -> {c['head_after']:,} "
              f"({c['head_after'] / c['head_before']:.3f}x)")
    print(f"{b} rows of width {result['width']}: prompt {result['mean_prompt']:.1f}, response "
          f"{result['mean_response']:.1f} tokens on average")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
