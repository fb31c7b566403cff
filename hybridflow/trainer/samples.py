"""Sample generations for a reader: the first few samples of a validation or an RL step as prompt, response,
reward and why the response ended. Only these few are decoded, on the collecting rank."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from hybridflow.data.step_batch import StepBatch


def sample_records(tokenizer: PreTrainedTokenizerBase, batch: StepBatch, step: int, split: str, n: int,
                   stop_token_ids: Sequence[int]) -> list[dict[str, Any]]:
    """One record per sample for the first `n` samples of a generated and scored `batch`.

    Text is decoded with its special tokens (the template, a stop token), as the model saw and wrote it.
    `finish_reason` is "stop" when the response ends with a stop id, else "length" (the token limit).
    """
    records = []
    for i in range(min(n, batch.size)):
        prompt = batch.tokens[i, : int(batch.prompt_lens[i])].tolist()
        response = batch.tokens[i][batch.response_mask[i].bool()].tolist()
        records.append({
            "step": step, "split": split,
            "prompt": tokenizer.decode(prompt), "response": tokenizer.decode(response),
            "reward": float(batch.scores[i]), "response_tokens": len(response),
            "finish_reason": "stop" if response and response[-1] in stop_token_ids else "length",
        })
    return records


def samples_markdown(records: list[dict[str, Any]]) -> str:
    """The records as TensorBoard text (markdown): one block per sample."""
    blocks = []
    for r in records:
        blocks.append(f"**reward {r['reward']:.3f}**, {r['response_tokens']} tokens ({r['finish_reason']})\n\n"
                      f"    {_indent(r['prompt'])}\n\n→\n\n    {_indent(r['response'])}")
    return "\n\n---\n\n".join(blocks)


def _indent(text: str) -> str:
    """A markdown code block's continuation lines (4 spaces), so the text shows verbatim."""
    return text.replace("\n", "\n    ")
