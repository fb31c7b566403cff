"""A tiny byte-level BPE tokenizer with a Qwen2-style ChatML template written for these tests: tools listed in
the system turn, tool calls as `<tool_call>` text, consecutive tool results grouped in one user turn as
`<tool_response>` blocks. Trained here on a few sentences, so no model files are needed."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

QWEN_STYLE_TEMPLATE = """
{%- if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}
{%- else %}{% set system = 'You are a helpful assistant.' %}{% endif %}
{{- '<|im_start|>system\\n' + system }}
{%- if tools %}
{{- '\\n\\n# Tools\\nCall a function as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.\\n<tools>' }}
{%- for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}
{{- '\\n</tools>' }}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- for m in messages %}
{%- if m['role'] == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}
{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}
{%- elif not (loop.first and m['role'] == 'system') %}
{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}
"""

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "You are a helpful assistant. Use the calculator tool for arithmetic.",
    "What is 37 * 24? A box holds 24 pencils and the school orders 37 boxes.",
    '<tool_call>{"name": "calculator", "arguments": {"expression": "37 * 24"}}</tool_call>',
    "<tool_response>\n888\n</tool_response> The answer is 888.\n#### 888",
    "# Tools\nCall a function as tool_call with name and arguments. tools functions object string",
]


def qwen_style_tokenizer(out_dir: Path, template: str = QWEN_STYLE_TEMPLATE) -> PreTrainedTokenizerFast:
    """The tiny tokenizer with `template` as its chat template, saved to and loaded from `out_dir`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=template)
    fast.save_pretrained(str(out_dir))
    return PreTrainedTokenizerFast.from_pretrained(str(out_dir))
