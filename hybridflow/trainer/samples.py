"""Sample generations for a reader: the first few samples of a validation or an RL step as prompt, response,
reward and why the response ended. Only these few are decoded, on the collecting rank."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from hybridflow.data.step_batch import StepBatch
from hybridflow.token_kinds import response_extent, segment_spans


def sample_records(tokenizer: PreTrainedTokenizerBase, batch: StepBatch, step: int, split: str, n: int,
                   stop_token_ids: Sequence[int]) -> list[dict[str, Any]]:
    """One record per sample for the first `n` samples of a generated and scored `batch`.

    Text is decoded with its special tokens (the template, a stop token), as the model saw and wrote it.
    `response` is every response-side token; `response_tokens` counts the sampled (assistant) ones.
    `finish_reason` is "stop" when the response ends with a stop id, else "length" (the token limit).
    A multi-turn sample also lists its `turns`: each segment's kind ("assistant", "observation"), text and token
    ids (what the engine sampled, what the chat template added: token-in-token-out drift shows here).
    """
    records = []
    extent, sampled = response_extent(batch.token_kinds), batch.loss_mask
    for i in range(min(n, batch.size)):
        prompt = batch.tokens[i, : int(batch.prompt_lens[i])].tolist()
        response = batch.tokens[i][extent[i].bool()].tolist()
        record = {
            "step": step, "split": split,
            "prompt": tokenizer.decode(prompt), "response": tokenizer.decode(response),
            "reward": float(batch.scores[i]), "response_tokens": int(sampled[i].sum()),
            "finish_reason": "stop" if response and response[-1] in stop_token_ids else "length",
        }
        spans = segment_spans(batch.token_kinds[i])
        if len(spans) > 1:
            record["turns"] = [{"kind": kind.name.lower(), "text": tokenizer.decode(batch.tokens[i, a:b].tolist()),
                                "ids": batch.tokens[i, a:b].tolist()} for a, b, kind in spans]
        records.append(record)
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
