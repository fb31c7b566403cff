"""benchmarks.token_count: hybridflow's and TRL's token counts agree on one batch, padding not counted (CPU)."""

import pytest
import torch
import torch.distributed as dist

from benchmarks.token_count import hybridflow_step_tokens, rates, trl_step_tokens
from hybridflow.config import ExperimentConfig
from hybridflow.data.step_batch import StepBatch
from hybridflow.trainer.rl_trainer import RLTrainer, StageTimer
from tests.single_turn import single_turn_kinds

EOS, PAD = 2, 0
# (prompt ids, response ids): different lengths, one response stopped at eos, one truncated
SAMPLES = [([5, 6, 7], [20, 21, EOS]), ([8, 9], [22]), ([10, 11, 12, 13], [23, 24, 25, 26, 27])]


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def hybridflow_record(width: int = 16) -> dict:
    """The RL record hybridflow's trainer logs for SAMPLES (prompt at column 0, response after it, padding)."""
    tokens = torch.full((len(SAMPLES), width), PAD)
    mask = torch.zeros(len(SAMPLES), width)
    for i, (p, r) in enumerate(SAMPLES):
        tokens[i, : len(p) + len(r)] = torch.tensor(p + r)
        mask[i, len(p) : len(p) + len(r)] = 1
    prompt_lens = torch.tensor([len(p) for p, _ in SAMPLES])
    batch = StepBatch(rows=[{}] * len(SAMPLES), tokens=tokens, prompt_lens=prompt_lens,
                      token_kinds=single_turn_kinds(prompt_lens, mask))
    batch.scores = torch.zeros(len(SAMPLES))
    trainer = RLTrainer(cfg=ExperimentConfig(), roles={}, meshes={}, rollout=None, scorer=None, kl_ctl=None,
                        algorithm=None, device=torch.device("cpu"), training=None)
    timer = StageTimer()
    timer.seconds["generate"] = 2.0
    return trainer._step_metrics(batch, {}, timer)


def trl_batch() -> dict:
    """The same samples as TRL's generation batch holds them: prompts left-padded, completions right-padded."""
    plen, clen = max(len(p) for p, _ in SAMPLES) + 2, max(len(r) for _, r in SAMPLES) + 3  # extra padding
    prompt_ids, prompt_mask = torch.full((len(SAMPLES), plen), PAD), torch.zeros(len(SAMPLES), plen, dtype=torch.long)
    comp_ids, comp_mask = torch.full((len(SAMPLES), clen), PAD), torch.zeros(len(SAMPLES), clen, dtype=torch.long)
    for i, (p, r) in enumerate(SAMPLES):
        prompt_ids[i, plen - len(p):], prompt_mask[i, plen - len(p):] = torch.tensor(p), 1
        comp_ids[i, : len(r)], comp_mask[i, : len(r)] = torch.tensor(r), 1
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": comp_ids,
            "completion_mask": comp_mask}


def test_both_counters_agree_on_one_batch_and_skip_padding(one_rank):
    want = sum(len(p) + len(r) for p, r in SAMPLES)
    batch = trl_batch()
    padded = batch["prompt_ids"].numel() + batch["completion_ids"].numel()
    assert padded > want  # the batch does hold padding to leave out
    record = hybridflow_record()
    assert trl_step_tokens(batch) == want
    assert hybridflow_step_tokens(record, len(SAMPLES)) == want
    # the trainer's own throughput figure counts the same tokens
    assert record["tokens_per_s"] * record["step_time_s"] == pytest.approx(want)


def test_rates_put_samples_and_step_time_beside_tokens():
    out = rates([100, 300], [1.0, 3.0], samples=8)
    assert out["throughput_tokens_per_s"] == pytest.approx(100.0)
    assert out["samples_per_s"] == pytest.approx(4.0) and out["step_time_s"] == pytest.approx(2.0)
    assert out["tokens_per_step"] == pytest.approx(200.0)
