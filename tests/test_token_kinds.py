"""Token kinds of a multi-turn trajectory: lengths count observation tokens, the loss mask does not, and
packing, row selection and concatenation keep both."""

import torch

from hybridflow.data.packing import as_rows, pack_rows
from hybridflow.data.step_batch import StepBatch, concat_batches
from hybridflow.token_kinds import (
    TokenKind,
    observation_share,
    prompt_kinds,
    segment_spans,
    turn_counts,
)

P, A, O = TokenKind.PROMPT, TokenKind.ASSISTANT, TokenKind.OBSERVATION


def two_turn_batch() -> StepBatch:
    """Row 0: prompt 2, assistant 3, observation 2, assistant 2 (9 tokens of 12). Row 1: single turn, 3 + 4."""
    kinds = torch.zeros(2, 12, dtype=torch.long)
    kinds[0, :9] = torch.tensor([P, P, A, A, A, O, O, A, A])
    kinds[1, :7] = torch.tensor([P, P, P, A, A, A, A])
    tokens = torch.arange(1, 25).reshape(2, 12) * (kinds != TokenKind.PAD)
    return StepBatch(rows=[{"id": 0}, {"id": 1}], tokens=tokens, prompt_lens=torch.tensor([2, 3]), token_kinds=kinds)


def test_lengths_include_observations_and_the_loss_mask_excludes_them():
    batch = two_turn_batch()
    assert batch.seq_lens.tolist() == [9, 7]
    assert batch.loss_mask[0].tolist() == [0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0]
    assert batch.loss_mask[1].tolist() == [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    assert segment_spans(batch.token_kinds[0]) == [(2, 5, A), (5, 7, O), (7, 9, A)]
    assert segment_spans(batch.token_kinds[1]) == [(3, 7, A)]
    assert turn_counts(batch.token_kinds).tolist() == [2, 1]
    assert observation_share(batch.token_kinds) == 2 / 11  # 2 observation tokens of 7 + 4 response-side ones
    assert observation_share(batch.token_kinds[1:]) == 0.0


def test_prompt_kinds_mark_the_prompt_columns_only():
    assert prompt_kinds(torch.tensor([2, 0]), 3).tolist() == [[P, P, 0], [0, 0, 0]]


def test_step_tensors_carry_the_full_length_and_the_loss_mask():
    tensors = two_turn_batch().tensors("loss_mask", rows=slice(0, 1))
    assert tensors["seq_lens"].tolist() == [9]
    assert tensors["loss_mask"].tolist() == [[0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0]]


def test_packing_keeps_observation_tokens_with_continuous_positions():
    batch = two_turn_batch()
    tensors = batch.tensors("loss_mask")
    mb = pack_rows(tensors, tensors["seq_lens"], [0, 1], pad_to=6)
    assert mb["cu_seqlens"].tolist() == [0, 9, 16, 18]  # two samples, then a padding segment
    assert mb["input_ids"][0, :9].tolist() == batch.tokens[0, :9].tolist()  # the observation tokens are in
    assert mb["position_ids"][0, :16].tolist() == list(range(9)) + list(range(7))
    assert mb["loss_mask"][0, :16].tolist() == [0, 0, 1, 1, 1, 0, 0, 1, 1] + [0, 0, 0, 1, 1, 1, 1]
    assert torch.equal(as_rows(mb["loss_mask"], mb, width=12), batch.loss_mask)


def test_trim_select_and_concat_keep_the_kinds():
    batch = two_turn_batch()
    batch.trim_columns(multiple=4, max_len=12)  # the longest sample is 9 tokens: 12 columns stay
    assert batch.tokens.shape == batch.token_kinds.shape == (2, 12)
    picked = batch.select(torch.tensor([1, 0]))
    assert picked.seq_lens.tolist() == [7, 9] and picked.rows == [{"id": 1}, {"id": 0}]
    narrow = two_turn_batch().select(torch.tensor([1]))
    narrow.trim_columns(multiple=8, max_len=12)  # 7 tokens: 8 columns
    both = concat_batches([narrow, two_turn_batch()])
    assert both.token_kinds.shape == (3, 12) and both.seq_lens.tolist() == [7, 9, 7]
    assert torch.equal(both.loss_mask[1:], two_turn_batch().loss_mask)
