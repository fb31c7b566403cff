"""Chat prompts: a prompt field holding a list of `{role, content}` messages, rendered with the tokenizer's chat
template into the text the policy sees; a plain string prompt is left as it is."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from hybridflow.errors import UserError


def is_chat(value: Any) -> bool:
    """True for a non-empty list of dicts each with string `role` and `content`."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in value)
    )


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]],
                tools: list[dict[str, Any]] | None = None) -> str:
    """The template's text with the assistant turn opened (`add_generation_prompt=True`), with the schemas of
    the rollout environment's `tools` when there is one (hybridflow.tools.environment_tools).

    A leading bos the template writes is dropped when encoding adds one itself, so the prompt does not start
    with two (Llama-style templates write `{{ bos_token }}` and their tokenizers prepend it too).
    """
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer("")["input_ids"][:1] == [tokenizer.bos_token_id]:
        text = text[len(bos):]
    return text


def render_chat_rows(
    rows: list[dict[str, Any]], prompt_key: str, tokenizer: PreTrainedTokenizerBase,
    tools: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Rows whose chat prompts are replaced by rendered text (the messages stay under `<prompt_key>_messages`)."""
    if not any(is_chat(row[prompt_key]) for row in rows):
        return rows
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"data.prompt_key: field {prompt_key!r} holds chat messages but the tokenizer has no chat template; "
            "set data.tokenizer to a tokenizer whose tokenizer_config.json has a chat_template, "
            "or store the prompt as plain text"
        )
    out = []
    for row in rows:
        value = row[prompt_key]
        if is_chat(value):
            row = {**row, prompt_key: render_chat(tokenizer, value, tools), f"{prompt_key}_messages": value}
        out.append(row)
    return out
