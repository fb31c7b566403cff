"""Sequence packing by token budget: bins by hand, the budget holds, every row once, and the packed layout
(thd offsets, restarting positions) maps back to the right-padded rows exactly."""

import random

import pytest
import torch

from hybridflow.data.packing import as_rows, empty_micro_batch, pack_by_token_budget, pack_rows


def test_first_fit_decreasing_by_hand():
    # longest first: 7 -> bin0, 6 -> bin1, 5 -> bin2, 3 -> bin0 (7+3=10), 2 -> bin1 (8), 2 -> bin1 (10)
    assert pack_by_token_budget([2, 7, 3, 5, 6, 2], budget=10) == [[0, 4, 5], [1, 2], [3]]
    assert pack_by_token_budget([4, 4], budget=8) == [[0, 1]]
    assert pack_by_token_budget([], budget=8) == []
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch: 8 is below a sample of 9 tokens"):
        pack_by_token_budget([3, 9], budget=8)


def test_random_lengths_keep_the_budget_and_every_row_once():
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 30))]
        budget = rng.randint(40, 120)
        bins = pack_by_token_budget(lengths, budget)
        assert sorted(r for b in bins for r in b) == list(range(len(lengths)))
        assert all(sum(lengths[r] for r in b) <= budget for b in bins)
        # first-fit decreasing never leaves two bins that would fit together
        loads = sorted(sum(lengths[r] for r in b) for b in bins)
        assert len(loads) < 2 or loads[0] + loads[1] > budget
        assert pack_by_token_budget(list(lengths), budget) == bins  # a function of the lengths only


def test_packed_layout_and_back():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [1, 2, 3, 4]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    lens = torch.tensor([3, 2, 4])
    mb = pack_rows({"input_ids": ids, "mask": mask, "score": torch.tensor([0.1, 0.2, 0.3])}, lens, [0, 2], pad_to=4)
    assert mb["input_ids"].tolist() == [[5, 6, 7, 1, 2, 3, 4, 0]]  # 7 tokens + a 1-token padding segment
    assert mb["cu_seqlens"].tolist() == [0, 3, 7, 8] and mb["cu_seqlens"].dtype == torch.int32
    assert mb["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0]]
    assert mb["segment_ids"].tolist() == [[0, 0, 0, 1, 1, 1, 1, 2]]
    assert mb["rows"].tolist() == [0, 2] and mb["score"].tolist() == pytest.approx([0.1, 0.3])
    back = as_rows(mb["mask"], mb, width=4)
    assert torch.equal(back, mask[[0, 2]])
    assert torch.equal(as_rows(mb["input_ids"], mb, width=4), torch.tensor([[5, 6, 7, 0], [1, 2, 3, 4]]))
    assert as_rows(mb["mask"], mb).shape == (2, 4)  # width defaults to the longest packed sample


def test_an_empty_micro_batch_is_one_padding_segment():
    ids = torch.tensor([[5, 6, 7, 0]])
    mb = empty_micro_batch({"input_ids": ids}, torch.tensor([3]), pad_to=2)
    assert mb["input_ids"].shape == (1, 2) and mb["cu_seqlens"].tolist() == [0, 2]
    assert mb["rows"].numel() == 0 and as_rows(mb["input_ids"].float(), mb, width=4).shape == (0, 4)
    assert pack_rows({"input_ids": ids}, torch.tensor([3]), [], pad_to=1)["cu_seqlens"].tolist() == [0, 1]
