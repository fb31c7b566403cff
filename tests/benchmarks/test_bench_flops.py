"""The actor-update FLOPs / MFU formula against a hand computation."""

import pytest

from benchmarks.flops import actor_update_flops, mfu
from hybridflow.config import ModelConfig
from hybridflow.placement.auto.from_config import model_shape


def _model() -> ModelConfig:
    return ModelConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=100)


def test_matmul_params_by_hand():
    # per layer: q, o 64x64 each; k, v 64x32 each (2 kv heads x head dim 16); gate, up, down 64x160 each
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 160
    assert layer == 43008
    assert model_shape(_model(), "actor").matmul_params == 3 * 43008 + 100 * 64  # + lm head


def test_actor_update_flops_by_hand():
    n = 3 * 43008 + 6400
    tokens, seq, epochs = 1000, 50, 2
    expected = epochs * tokens * (6 * n + 12 * 3 * 64 * seq)
    assert actor_update_flops(_model(), tokens, seq, epochs) == pytest.approx(expected)
    assert expected == 2 * 1000 * (6 * 135424 + 115200)


def test_mfu_by_hand():
    # 4.0e14 FLOPs in 2 s on 2 GPUs of 100 TFLOP/s peak = 1e14 FLOP/s per GPU of 1e14 = 100 %; half of it:
    assert mfu(2.0e14, 2.0, 2, 100.0) == pytest.approx(0.5)
    assert mfu(1.0, 0.0, 1, 100.0) == 0.0
