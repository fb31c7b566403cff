"""The run's preflight on the launching process: what it refuses is tested through the CLI
(test_run_bad_input.py); here, what it tells the user when it drops over-long prompts, and the GPU memory check
(no GPU here: the card's figures are passed in)."""

import json
from types import SimpleNamespace

import pytest
import torch

from hybridflow.config import load_experiment
from hybridflow.errors import UserError
from hybridflow.placement import plan_placement
from hybridflow.resolve import resolve_experiment
from hybridflow.rewards import reads_row_fields
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


def test_an_engine_that_takes_a_share_of_the_card_takes_it_of_this_card():
    # Stop 56: grpo_smollm2 with rollout=vllm, planned at the H200's size, was refused on an H100 (89.1 GiB,
    # 42 of it vLLM's 0.3 x 141 GiB); vLLM takes 0.3 of the card it runs on, and the run fits there.
    cfg, plan = _planned("grpo_smollm2", "rollout=vllm")
    rollout = plan.role_memory[0]["rollout"]
    assert rollout.kv_cache == int(0.3 * 141 * 2**30) - rollout.weights
    check_device_memory(cfg, plan, *H100)
    # a headroom the user set stays as set on the smaller card (the default one is that card's: 2 + 5 %)
    cfg2, plan2 = _planned("grpo_smollm2", "rollout=vllm", "cluster.gpu_memory_headroom_gib=20")
    with pytest.raises(UserError, match=r"79\.6 GiB, 59\.6 after the 20\.00 GiB headroom"):
        check_device_memory(cfg2, plan2, *H100)
    # the share is still counted: on a 40 GiB card the same plan does not fit
    with pytest.raises(UserError, match=r"^cluster\.gpu_type: the plan needs "):
        check_device_memory(cfg, plan, 40 * 2**30, "a 40 GiB card")


def test_rows_without_the_field_the_reward_or_warm_up_reads_are_refused(tmp_path):
    # Before: the first SFT step (trainer/loop.py) or the first scoring (rewards/answer_match.py) refused them,
    # on a rank after the processes had started.
    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"{i}>", **({"answer": str(i)} if i % 4 else {})}) + "\n"
                           for i in range(40)))
    base = [f"data.source={src}", "model.vocab_size=100"]
    with pytest.raises(UserError, match=r"^trainer\.warmup_sft_steps: the dataset rows have no 'answer' field"):
        _notes(*base)  # tiny_cpu warms up on the answers first
    with pytest.raises(UserError, match=r"^reward\.fn: answer_match reads each row's 'answer' field, which 10 of "
                                        r"the 40 rows of data\.source lack; add it or set another reward\.fn"):
        _notes(*base, "trainer.warmup_sft_steps=0")
    with pytest.raises(UserError, match=r"which 10 of the 40 rows of the validation set lack"):
        src.with_name("train.jsonl").write_text(
            "".join(json.dumps({"prompt": f"{i}>", "answer": str(i)}) + "\n" for i in range(40)))
        _notes(f"data.source={src.with_name('train.jsonl')}", f"data.val_source={src}", "model.vocab_size=100",
               "trainer.val_every=5", "trainer.warmup_sft_steps=0")
    assert reads_row_fields("answer")(lambda batch: []).row_fields == ("answer",)


def test_warm_up_answers_longer_than_the_sequence_are_refused_before_the_ranks_start(tmp_path):
    # Before: the first warm-up step (data/batching.py collate_sft) refused them on a rank.
    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"{i:06d}>", "answer": "7" * (30 if i % 2 else 3)}) + "\n"
                           for i in range(64)))
    base = [f"data.source={src}", "model.vocab_size=100"]
    with pytest.raises(UserError, match=r"^data\.seq_length: prompt \+ answer needs 39 tokens, more than 32; "):
        _notes(*base)
    assert _notes(*base, "data.seq_length=40", "data.max_prompt_length=8") == []


def test_a_multi_turn_environment_over_text_prompts_is_refused_before_the_ranks_start():
    # Before: the first episode (rollout/turns.py start_episode) refused it on a rank.
    with pytest.raises(UserError, match=r"^rollout\.environment: 'calculator' needs chat prompts, but "
                                        r"data\.prompt_key='prompt' holds text"):
        _notes("rollout.environment=calculator", "trainer.warmup_sft_steps=0")
