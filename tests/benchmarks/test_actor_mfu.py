"""benchmarks/actor_mfu.py: both FLOP conventions by hand, and the CPU smoke run in both modes."""

import contextlib
import json
import os
import socket
import subprocess
import sys

import pytest
from transformers import LlamaConfig

from benchmarks.actor_mfu import cost_model_flops_per_token, model_flops_per_token
from tests.trainer.run_helpers import REPO

TINY = LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=100, tie_word_embeddings=False)


def test_palm_flops_by_hand():
    # matmul weights: 3 layers x (q, o 64x64; k, v 64x32; gate, up, down 64x160) + the 100 x 64 head
    n = 3 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 160) + 100 * 64
    forward = 2 * n + 4 * 3 * 50 * 64  # full-square attention over 50 tokens
    assert model_flops_per_token(TINY, 50, passes=1) == forward == 309248
    assert model_flops_per_token(TINY, 50) == 3 * forward


def test_cost_model_flops_by_hand():
    # the planner's convention: the same matmuls, attention over seq / 2 on average
    dense = 2 * (3 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 160) + 100 * 64)
    forward = dense + 4 * 3 * 64 * 25
    assert cost_model_flops_per_token(TINY, 50, passes=1) == forward == 290048
    assert cost_model_flops_per_token(TINY, 50) == 3 * forward


@pytest.mark.slow  # a process-level run: out of the default tier's 10 minutes
@pytest.mark.parametrize("mode", ["train", "forward"])
def test_quick_run_reports_both_mfus(tmp_path, mode):
    out = tmp_path / "mfu.json"
    # The port it once fixed is taken (as by a concurrent run): the one-rank world must listen elsewhere.
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # bind even while it is in TIME_WAIT
        with contextlib.suppress(OSError):  # already listened on by someone else: the same situation
            taken.bind(("", 29533))
            taken.listen()
        env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
        subprocess.run([sys.executable, "benchmarks/actor_mfu.py", "--quick", "--mode", mode, "--steps", "1",
                        "--json", str(out)], cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["mode"] == mode and result["step_s"] > 0
    # the causal halving makes the planner's count smaller than PaLM's for the same measured time
    assert 0 < result["cost_model_mfu"] < result["mfu"]
