"""benchmarks.precision_gradient: its gradient-comparison metrics on hand-made tensors (CPU, no model)."""

import math

import pytest
import torch

from benchmarks.precision_gradient import (
    compare,
    cosine,
    group_advantages,
    param_kind,
    relative_l2_error,
    sign_agreement,
    sign_cosine,
)


def test_identical_and_negated_vectors():
    g = torch.tensor([0.5, -2.0, 3.0, -0.1, 1.0])
    assert cosine(g, g) == pytest.approx(1.0)
    assert relative_l2_error(g, g) == 0.0
    assert sign_agreement(g, g) == 1.0
    assert sign_cosine(g, g) == pytest.approx(1.0)
    assert cosine(-g, g) == pytest.approx(-1.0)
    assert relative_l2_error(-g, g) == pytest.approx(2.0)
    assert sign_agreement(-g, g) == 0.0
    assert sign_cosine(-g, g) == pytest.approx(-1.0)


def test_small_example_by_hand():
    ref = torch.tensor([1.0, 0.0])
    g = torch.tensor([1.0, 1.0])
    assert cosine(g, ref) == pytest.approx(1 / math.sqrt(2))
    assert relative_l2_error(g, ref) == pytest.approx(1.0)  # ||(0, 1)|| / ||(1, 0)||
    # |ref| = 1, 2, 3, 4 has median 2 (torch's lower median): only the elements of |ref| 3 and 4 count
    ref = torch.tensor([1.0, -2.0, 3.0, -4.0])
    g = torch.tensor([-1.0, 2.0, 3.0, 4.0])  # the two counted: 3 agrees, -4 does not
    assert sign_agreement(g, ref) == 0.5
    assert sign_cosine(g, ref) == pytest.approx(-0.5)  # signs agree on 1 of 4 elements: (1 - 3) / 4
    assert math.isnan(cosine(torch.zeros(3), torch.ones(3)))


def test_param_kind_and_compare_pooling():
    assert param_kind("model.layers.0.self_attn.q_proj.weight") == "matmul"
    assert param_kind("model.layers.3.mlp.down_proj.weight") == "matmul"
    assert param_kind("model.layers.0.input_layernorm.weight") == "norm"
    assert param_kind("model.norm.weight") == "norm"
    assert param_kind("model.embed_tokens.weight") == "embedding"
    ref = {"matmul": torch.tensor([1.0, 2.0, 3.0, 4.0]), "norm": torch.tensor([1.0, -5.0])}
    g = {"matmul": ref["matmul"].clone(), "norm": -ref["norm"]}
    out = compare(g, ref)
    assert out["matmul"]["cosine"] == pytest.approx(1.0) and out["norm"]["cosine"] == pytest.approx(-1.0)
    # pooled: matmul counts 2 agreeing elements (3, 4), norm 1 disagreeing (-5)
    assert out["all"]["sign_agree_above_median"] == pytest.approx(2 / 3)
    assert out["all"]["cosine"] == pytest.approx((30 - 26) / 56)


def test_group_advantages():
    adv = group_advantages(torch.tensor([[1.0, 0.0, 1.0, 0.0], [2.0, 2.0, 2.0, 2.0]]))
    s = math.sqrt(1 / 3)  # unbiased std of 1, 0, 1, 0
    assert adv[0].tolist() == pytest.approx([0.5 / s, -0.5 / s, 0.5 / s, -0.5 / s], rel=1e-5)
    assert adv[1].tolist() == [0.0] * 4
