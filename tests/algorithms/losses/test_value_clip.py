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


def test_values_inside_the_clip_range_are_never_counted_clipped():
    # V_old + (V - V_old) is V only up to an ulp when V_old is much smaller than V (here 64 of 4096 differ, and
    # 3 of those land farther from the return): that must not count as clipping, nor change the loss.
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(4096, generator=gen) * 1e-3
    values = (torch.rand(4096, generator=gen) - 0.5) * 0.38  # |V - V_old| < 0.2 = cliprange
    returns = torch.randn(4096, generator=gen)
    loss, was_clipped = clipped_value_loss(values, old, returns, 0.2)
    assert not was_clipped.any()
    torch.testing.assert_close(loss, 0.5 * (values - returns) ** 2)
