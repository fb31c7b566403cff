"""benchmarks.step_columns' count: body and head positions of one pass, before (row order, the batch's width) and
after (length-sorted micro-batches in 64-column steps, the head at the loss tokens), checked by hand."""

import torch

from benchmarks.step_columns import count


def test_count_by_hand():
    # 4 rows of width 192: lengths 40, 150, 60, 130 (prompt 10 each, the rest response)
    lengths = [40, 150, 60, 130]
    ids = torch.ones(4, 192, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, 10:length] = 1
    got = count({"input_ids": ids, "loss_mask": mask, "seq_lens": torch.tensor(lengths)}, rows=2)
    # sorted pairs (40, 60) -> 64 columns, (130, 150) -> 192 columns
    assert got == {"body_before": 4 * 192, "head_before": 4 * 192, "body_after": 2 * 64 + 2 * 192,
                   "head_after": sum(lengths) - 4 * 10}
