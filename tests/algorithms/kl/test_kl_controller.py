import pytest

from hybridflow.algorithms import AdaptiveKLController, FixedKLController, build_kl_controller
from hybridflow.errors import UserError


def test_fixed_never_moves():
    ctl = FixedKLController(0.05)
    ctl.update(current_kl=100.0, n_steps=1000)
    assert ctl.value == 0.05


@pytest.mark.parametrize(
    ("kl", "error"),
    [(9.0, 0.2), (6.6, 0.1), (5.7, -0.05), (0.0, -0.2)],  # errors beyond +-0.2 are clipped
)
def test_adaptive_update_formula(kl, error):
    ctl = AdaptiveKLController(value=0.1, target=6.0, horizon=10_000)
    ctl.update(current_kl=kl, n_steps=256)
    assert ctl.value == pytest.approx(0.1 * (1 + error * 256 / 10_000))


def test_adaptive_state_round_trip_continues_identically():
    a = AdaptiveKLController(0.2, target=1.0, horizon=100)
    for kl in (3.0, 0.5, 1.1):
        a.update(kl, 8)
    b = build_kl_controller("adaptive", kl_coef=99.0, kl_target=1.0, kl_horizon=100)
    b.load_state_dict(a.state_dict())
    for kl in (0.2, 2.0):
        a.update(kl, 8)
        b.update(kl, 8)
    assert a.value == b.value and a.state_dict() == b.state_dict()


def test_resume_takes_the_configs_kl_settings_and_may_switch_controllers():
    adapted = AdaptiveKLController(0.2, target=1.0, horizon=100)
    adapted.update(3.0, 8)
    retargeted = build_kl_controller("adaptive", kl_coef=0.2, kl_target=5.0, kl_horizon=7)
    retargeted.load_state_dict(adapted.state_dict())  # the adapted value goes on, toward the new target
    assert (retargeted.value, retargeted.target, retargeted.horizon) == (adapted.value, 5.0, 7)
    fixed = build_kl_controller("fixed", kl_coef=0.05, kl_target=None, kl_horizon=None)
    fixed.load_state_dict(adapted.state_dict())  # a fixed coefficient is the config's
    assert fixed.value == 0.05
    from_fixed = build_kl_controller("adaptive", kl_coef=0.3, kl_target=1.0, kl_horizon=100)
    from_fixed.load_state_dict(FixedKLController(0.1).state_dict())  # was KeyError: 'target'
    assert from_fixed.value == 0.1
    again = build_kl_controller("fixed", kl_coef=0.02, kl_target=None, kl_horizon=None)
    again.load_state_dict(FixedKLController(0.1).state_dict())  # was: the checkpoint's 0.1 silently
    assert again.value == 0.02


def test_build_errors_name_the_field():
    assert isinstance(build_kl_controller("fixed", 0.1, None, None), FixedKLController)
    with pytest.raises(UserError, match="algorithm.kl_controller"):
        build_kl_controller("pid", 0.1, 1.0, 10)
    with pytest.raises(UserError, match="algorithm.kl_target"):
        build_kl_controller("adaptive", 0.1, 0.0, 10)


def test_sequence_kl_is_the_mean_over_responses_of_their_summed_kl():
    import torch

    from hybridflow.algorithms import sequence_kl

    kl = torch.tensor([[0.1, 0.2, 0.3, float("nan")], [1.0, float("inf"), 5.0, 5.0], [7.0, 7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    # responses: 0.1 + 0.2 + 0.3 = 0.6 and 1.0; the empty third row counts nowhere. A mean over all tokens
    # would give 1.6 / 4 = 0.4, verl's mean of token means (0.2 + 1.0) / 2 = 0.6.
    assert sequence_kl(kl, mask).item() == pytest.approx((0.6 + 1.0) / 2)
    assert sequence_kl(kl, torch.zeros_like(mask)).item() == 0.0
