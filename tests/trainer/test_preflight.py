"""The run's preflight on the launching process: what it refuses is tested through the CLI
(test_run_bad_input.py); here, what it tells the user when it drops over-long prompts, and the GPU memory check
(no GPU here: the card's figures are passed in)."""

from types import SimpleNamespace

import pytest
import torch

from hybridflow.config import load_experiment
from hybridflow.errors import UserError
from hybridflow.placement import plan_placement
from hybridflow.resolve import resolve_experiment
from hybridflow.trainer.preflight import check_device_memory, check_devices, preflight


def _notes(*overrides):
    cfg = load_experiment("tiny_cpu", list(overrides))
    return preflight(cfg, plan_placement(cfg))


def test_dropped_prompts_are_counted_out_of_the_total():
    # builtin:max_digit: 8192 prompts of 5-8 tokens, 2024 of them 8 (seed 1234); validation draws its own 64.
    assert _notes("data.max_prompt_length=7") == [
        "data: dropped 2024 of 8192 prompts longer than data.max_prompt_length=7 tokens (data.overlong_prompts=drop)"]
    notes = _notes("data.max_prompt_length=7", "trainer.val_every=5")
    assert len(notes) == 2 and notes[1].startswith("data: dropped ") and " of 64 validation prompts " in notes[1]


def test_nothing_to_say_when_every_prompt_fits():
    assert _notes() == []


H100 = (81559 * 2**20, "NVIDIA H100 80GB HBM3")  # what torch reports for an "80 GB" H100


def _planned(experiment, *overrides):
    cfg = resolve_experiment(experiment, list(overrides))
    return cfg, plan_placement(cfg)


def test_a_plan_for_a_larger_card_is_refused_on_this_one(monkeypatch):
    cfg, plan = _planned("ppo_llama_1b_h200")  # planned for an H200: ~113 GiB of its 132 usable
    with pytest.raises(UserError, match=r"^cluster\.gpu_type: the plan needs 11\d\.\d GiB per GPU, planned for H200 "
                                        r"\(141 GiB\); this machine's NVIDIA H100 80GB HBM3 has 79\.6 GiB"):
        check_device_memory(cfg, plan, *H100)
    check_device_memory(cfg, plan, 143771 * 2**20, "NVIDIA H200")  # the card it was planned for (140.4 GiB)
    # the glue: the smallest of the node's GPUs is the one checked
    cards = [SimpleNamespace(total_memory=143771 * 2**20, name="NVIDIA H200"), SimpleNamespace(
        total_memory=H100[0], name=H100[1])]
    cfg2, plan2 = _planned("ppo_llama_1b_h200", "cluster.gpus_per_node=2", "roles.ref.enabled=false")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: cards[i])
    with pytest.raises(UserError, match="this machine's NVIDIA H100 80GB HBM3"):
        check_devices(cfg2, plan2)


def test_a_plan_that_fits_the_smaller_card_runs_there():
    cfg, plan = _planned("grpo_smollm2")  # planned for an H200, needs ~49 GiB: fits an H100's 70.6 after headroom
    assert plan.capacity_bytes == 141 * 2**30
    check_device_memory(cfg, plan, *H100)
