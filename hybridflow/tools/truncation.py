"""Bounding an observation: a tool response longer than the limit keeps its head and tail and says in the middle
how much was cut, so the model sees both how the output starts and how it ends (errors usually come last)."""

from __future__ import annotations

from typing import Protocol


class TextTokenizer(Protocol):
    """The two methods of an HF tokenizer this module uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def truncation_marker(cut: int, unit: str) -> str:
    """The line that replaces the middle of a truncated response."""
    return f"\n[... {cut} {unit} truncated ...]\n"


def truncate_middle(text: str, max_tokens: int, tokenizer: TextTokenizer | None = None) -> str:
    """`text` if it has at most `max_tokens` tokens (characters without a tokenizer), else its first and last
    tokens around a marker, the kept tokens totalling `max_tokens`. The observation is new text, so encoding it
    here touches no sampled id; the marker's own tokens are not counted (it is a few tokens, fixed size)."""
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    if tokenizer is None:
        if len(text) <= max_tokens:
            return text
        head, tail = (max_tokens + 1) // 2, max_tokens // 2
        return text[:head] + truncation_marker(len(text) - max_tokens, "characters") + text[len(text) - tail:]
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text
    head, tail = (max_tokens + 1) // 2, max_tokens // 2
    return (tokenizer.decode(ids[:head]) + truncation_marker(len(ids) - max_tokens, "tokens")
            + tokenizer.decode(ids[len(ids) - tail:]))
