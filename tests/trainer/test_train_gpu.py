"""The one-GPU experiment's code path (nccl, bf16, every role on GPU 0) at a tiny model size.

The full ~1.2B run is a benchmark (benchmarks/results/); this checks the same path end to end quickly: PPO
steps with bf16 parity within the experiment's gate, peak memory recorded, a checkpoint written and resumed.
"""

import pytest

from tests.trainer.run_helpers import rl_records, run

pytestmark = pytest.mark.gpu

TINY_ON_ONE_GPU = ("+experiment=ppo_llama_1b_h200", "model=tiny_llama", "model.dtype=bf16",
                   "data.source=builtin:max_digit", "data.train_batch_size=8", "algorithm.mini_batch_size=8",
                   "rollout.max_new_tokens=8", "data.max_prompt_length=16", "data.seq_length=32",
                   "trainer.save_every=2")


def test_ppo_on_one_gpu_then_resume(tmp_path):
    run(tmp_path, *TINY_ON_ONE_GPU, "trainer.total_steps=2")
    first = rl_records(tmp_path)
    assert [r["step"] for r in first] == [1, 2]
    assert all(r["peak_memory_gib"] > 0 for r in first)
    assert all(r["peak_reserved_gib"] >= r["peak_memory_gib"] and r["device_used_gib"] > 0 for r in first)
    assert all(r["parity/max_abs"] < 0.1 for r in first)  # bf16 on both sides of the gate
    assert (tmp_path / "final_hf" / "config.json").exists()

    run(tmp_path, *TINY_ON_ONE_GPU, "trainer.total_steps=3")  # resume=auto picks step 2's checkpoint
    assert [r["step"] for r in rl_records(tmp_path)] == [1, 2, 3]
