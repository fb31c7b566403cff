import pytest
import torch

from hybridflow.data import build_char_tokenizer, collate_prompts, collate_sft
from hybridflow.errors import UserError


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_char_tokenizer(tmp_path_factory.mktemp("tok"))


def test_right_padded_prompts(tok):
    batch = collate_prompts(tok, ["12>", "4>"], max_prompt_length=8, rows=[{"a": 1}, {"a": 2}])
    bos, pad = tok.bos_token_id, tok.pad_token_id
    ids = tok("12>", add_special_tokens=False)["input_ids"]
    assert batch.input_ids.tolist() == [
        [bos, *ids],
        [bos, *tok("4>", add_special_tokens=False)["input_ids"], pad],
    ]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch.prompt_lens.tolist() == [4, 3]
    assert batch.input_ids.dtype == torch.long and batch.rows == [{"a": 1}, {"a": 2}]
    wide = collate_prompts(tok, ["12>"], max_prompt_length=8, total_len=7)
    assert wide.input_ids.shape == (1, 7) and wide.input_ids[0, 4:].tolist() == [pad] * 3


def test_overlong_prompt(tok):
    with pytest.raises(UserError, match="data.max_prompt_length"):
        collate_prompts(tok, ["123456"], max_prompt_length=4)


def test_sft_batch_masks_answer_and_eos(tok):
    batch = collate_sft(tok, ["31>", "5>"], ["13", "5"], max_length=16)
    row0 = tok.decode(batch.input_ids[0])
    assert row0 == "<bos>31>13<eos>"
    assert batch.loss_mask.tolist() == [[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 7, [1] * 5 + [0, 0]]
    assert (
        batch.input_ids[1, 4].item() == tok.eos_token_id and batch.input_ids[1, 5].item() == tok.pad_token_id
    )
    with pytest.raises(UserError, match="data.seq_length"):
        collate_sft(tok, ["31>"], ["13"], max_length=5)
