"""With SmolLM2's real tokenizer, a built-in chat task's prompts carry the chat template exactly once: one
`<|im_start|>` per turn (system, user, the opened assistant turn), none doubled at the start."""

from __future__ import annotations

from hybridflow.data import PromptLoader, load_prompt_dataset, load_tokenizer
from tests.packaged_model import smollm2_checkpoint

IM_START = 1  # SmolLM2's bos_token, which its template writes at each turn


def test_chat_template_is_applied_once_without_double_bos():
    tokenizer = load_tokenizer(smollm2_checkpoint())
    assert tokenizer.bos_token_id == IM_START and tokenizer.eos_token_id == 2
    dataset = load_prompt_dataset("builtin:gsm8k_easy", seed=0, num_builtin_examples=8)
    loader = PromptLoader(dataset, tokenizer, batch_size=8, max_prompt_length=160, shuffle=False)
    batch = loader.next_batch()
    for ids, n, row in zip(batch.input_ids, batch.prompt_lens, batch.rows, strict=True):
        ids = ids[: int(n)].tolist()
        assert ids[0] == IM_START and ids[1] != IM_START
        assert ids.count(IM_START) == len(row["prompt_messages"]) + 1 == 5
        text = tokenizer.decode(ids)
        assert text.startswith("<|im_start|>system\n" + row["prompt_messages"][0]["content"])
        assert row["prompt_messages"][-1]["content"] in text and text.endswith("<|im_start|>assistant\n")
    assert max(batch.prompt_lens) <= 160 and loader.num_dropped == 0
