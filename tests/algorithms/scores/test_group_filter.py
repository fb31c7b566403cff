import torch

from hybridflow.algorithms import DropUniformGroups, varied_groups


def test_groups_with_all_equal_scores_are_dropped():
    scores = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.25])
    keep = varied_groups(scores, 4)
    assert keep.tolist() == [False] * 4 + [True] * 4 + [False] * 4 + [True] * 4


def test_filter_object_keeps_rows_of_varied_pairs():
    keep = DropUniformGroups(group_size=2, max_extra_draws=1).keep(torch.tensor([0.0, 1.0, 2.0, 2.0]))
    assert keep.tolist() == [True, True, False, False]
