"""Token-in-token-out: the token ids a chat template adds for an observation, without re-tokenizing history.

A trajectory's ids are the prompt's ids, then for each turn the engine's sampled ids *verbatim* and the ids
returned here for the observation that follows. They are found by rendering: the conversation so far (its
last message the assistant turn, as decoded text), and the same plus the new messages with the next
assistant turn opened; the difference of the two renderings' token ids is what the template adds. The
sampled ids never pass through decode/encode; the history's text is rendered only to measure the difference.

The boundary after the assistant turn: the template closes a turn with tokens of its own (ChatML:
`<|im_end|>` and a newline). The engine stops on the end token, so it sampled the first of them and not the
newline; `closing` finds the template's closing by rendering an empty assistant turn, and the ids returned
start with the part of it the sampled ids lack (just the newline; `<|im_end|>\\n` when the turn was cut at
max tokens or stopped on a string). Peers' most reported drift is exactly that newline.

A template must only *grow* as the conversation grows: if rendering more messages changes the tokens of the
earlier ones (a template that groups consecutive tool messages into one turn changes the first one's ending
when a second is added; one that drops earlier reasoning), `TemplateMismatch` says where. Render all of a
step's observation messages at once (`new_messages`) for the grouping templates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from hybridflow.errors import UserError

Messages = Sequence[dict[str, Any]]


class TemplateMismatch(UserError):
    """The chat template's rendering of a conversation is not a prefix of its rendering of the longer one."""


def render_ids(tokenizer: PreTrainedTokenizerBase, messages: Messages, tools: list[dict] | None = None,
               add_generation_prompt: bool = False) -> list[int]:
    """The token ids of the template's rendering of `messages` (no special tokens added by encoding: the
    template writes its own)."""
    text = tokenizer.apply_chat_template(list(messages), tools=tools, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
    return tokenizer.encode(text, add_special_tokens=False)


def _require_prefix(tokenizer: PreTrainedTokenizerBase, short: list[int], long: list[int], what: str) -> None:
    if long[: len(short)] == short:
        return
    at = next((i for i, (a, b) in enumerate(zip(short, long, strict=False)) if a != b), min(len(short), len(long)))
    shown = tokenizer.convert_ids_to_tokens
    raise TemplateMismatch(
        f"data.tokenizer: the chat template renders the conversation differently once {what} (token {at}: "
        f"{shown(short[at:at + 3])} before, {shown(long[at:at + 3])} after), so observation tokens cannot be "
        "appended to the sampled ones; use a template whose rendering of earlier turns does not change as "
        "turns are added (and pass all of a step's observation messages at once)")


def closing_ids(tokenizer: PreTrainedTokenizerBase, messages: Messages, tools: list[dict] | None = None) -> list[int]:
    """The ids the template writes after an assistant turn's content, rendered in the context of `messages`
    (the conversation before that turn): ChatML's `<|im_end|>` and newline."""
    opened = render_ids(tokenizer, messages, tools, add_generation_prompt=True)
    empty_turn = render_ids(tokenizer, [*messages, {"role": "assistant", "content": ""}], tools)
    _require_prefix(tokenizer, opened, empty_turn, "an assistant turn is added to the generation prompt")
    closing = empty_turn[len(opened):]
    if not closing:
        raise TemplateMismatch("data.tokenizer: the chat template writes nothing after an assistant turn, so a "
                               "turn's end cannot be told from the next message; use a template that closes turns")
    return closing


def missing_closing(sampled_ids: Sequence[int], closing: Sequence[int]) -> list[int]:
    """The part of `closing` the sampled ids do not already end with (the longest overlap counts)."""
    for k in range(min(len(closing), len(sampled_ids)), 0, -1):
        if list(sampled_ids[-k:]) == list(closing[:k]):
            return list(closing[k:])
    return list(closing)


def observation_ids(tokenizer: PreTrainedTokenizerBase, messages: Messages, sampled_ids: Sequence[int],
                    new_messages: Messages, tools: list[dict] | None = None) -> list[int]:
    """The ids to append after the assistant turn's `sampled_ids` for `new_messages` (the observation), ending
    with the next assistant turn's generation prompt. `messages` is the conversation so far, its last message
    the assistant turn whose content is the sampled text decoded without special tokens."""
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("observation_ids: the conversation must end with the assistant turn just sampled")
    if not new_messages:
        raise ValueError("observation_ids: no new messages to append")
    closing = closing_ids(tokenizer, messages[:-1], tools)
    before = render_ids(tokenizer, messages, tools)
    if before[-len(closing):] != closing:
        raise TemplateMismatch(f"data.tokenizer: the chat template closes this assistant turn with "
                               f"{tokenizer.convert_ids_to_tokens(before[-len(closing):])}, not with the "
                               f"{tokenizer.convert_ids_to_tokens(closing)} it writes after an empty one; use a "
                               "template that closes every assistant turn the same way")
    after = render_ids(tokenizer, [*messages, *new_messages], tools, add_generation_prompt=True)
    _require_prefix(tokenizer, before, after, f"{len(new_messages)} message(s) are added after the assistant turn")
    return missing_closing(sampled_ids, closing) + after[len(before):]
