import pytest
import torch

from hybridflow.algorithms import clipped_value_loss


@pytest.mark.parametrize(
    ("value", "old", "ret", "expected", "clipped"),
    [
        (1.0, 0.9, 1.2, 0.5 * 0.2**2, False),  # within the clip range: plain squared error
        (2.0, 0.0, 3.0, 0.5 * 2.8**2, True),  # moved toward the target past the range: clipped term is larger
        (2.0, 0.0, 2.0, 0.5 * 1.8**2, True),  # moved past the range onto the target: still penalised
        (-1.0, 0.0, 0.0, 0.5 * 1.0**2, False),  # moved away from the target: unclipped term is larger
    ],
)
def test_value_clip_cases(value, old, ret, expected, clipped):
    loss, was_clipped = clipped_value_loss(
        torch.tensor([value]), torch.tensor([old]), torch.tensor([ret]), 0.2
    )
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert bool(was_clipped) is clipped


def test_gradient_zero_when_clipped_term_dominates():
    values = torch.tensor([2.0], requires_grad=True)
    loss, _ = clipped_value_loss(values, torch.tensor([0.0]), torch.tensor([3.0]), 0.2)
    loss.sum().backward()
    assert values.grad.item() == 0.0
