"""One token count for every side of a comparison: prompt + response tokens an RL step processed, no padding.

Both sides count the same thing from the same token ids: each sample's prompt tokens plus its response tokens
(eos included where the sample stopped on it), summed over the step's samples. `step_tokens` is that sum;
`trl_step_tokens` applies it to the batch TRL's GRPOTrainer builds (left-padded `prompt_mask`, right-padded
`completion_mask`: padding is 0 there), `hybridflow_step_tokens` to one RL record of hybridflow's
metrics.jsonl (its `prompt_length` and `response_length` are the step's per-sample means, from the same
`prompt_lens` and `token_kinds` the trainer trains on).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def step_tokens(prompt_lengths: torch.Tensor, response_lengths: torch.Tensor) -> int:
    """Prompt + response tokens of one step's samples (lengths per sample, padding not included)."""
    return int(prompt_lengths.sum()) + int(response_lengths.sum())


def trl_step_tokens(batch: Mapping[str, torch.Tensor]) -> int:
    """The tokens of one TRL generation batch (`GRPOTrainer._generate_and_score_completions`' output)."""
    return step_tokens(batch["prompt_mask"].sum(1), batch["completion_mask"].sum(1))


def hybridflow_step_tokens(record: Mapping[str, float], samples: int) -> int:
    """The tokens of one hybridflow RL step from its metrics.jsonl record: per-sample means x `samples`."""
    lengths = torch.tensor([record["prompt_length"], record["response_length"]], dtype=torch.float64) * samples
    return step_tokens(lengths[:1].round(), lengths[1:].round())


def rates(tokens: list[int], step_times_s: list[float], samples: int) -> dict[str, float]:
    """The throughput figures a report shows side by side: tokens/s, samples/s, mean step time, tokens/step."""
    seconds = sum(step_times_s)
    return {"throughput_tokens_per_s": sum(tokens) / seconds, "samples_per_s": samples * len(step_times_s) / seconds,
            "step_time_s": seconds / len(step_times_s), "tokens_per_step": sum(tokens) / len(tokens)}
