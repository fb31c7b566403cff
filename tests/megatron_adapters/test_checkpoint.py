"""dist_checkpointing: a checkpoint saved at TP2 x PP2 loads at TP1 (x DP4) and at TP4 with identical logits.

"Identical" is checked bit for bit against the same layout built straight from the HF weights (a different
TP changes float reduction order, so across layouts the check is the HF tolerance instead). Also: optimizer
state round-trips (and old-format checkpoints load), and roles that global rank 0 does not hold save and load.
"""

import pytest
import torch
import torch.distributed as dist

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import hf_logits, pipeline_forward, save_tiny_model, token_batch


def _reshard_rank(hf_dir, ckpt_dir, ids):
    from megatron_adapters.checkpoint import checkpoint_hf_config, load_checkpoint, save_checkpoint
    from megatron_adapters.hf_safetensors import load_hf_weights
    from megatron_adapters.model import build_gpt
    from megatron_adapters.process_groups import build_role_groups

    ranks = list(range(dist.get_world_size()))
    saved = build_gpt(hf_dir, build_role_groups(ranks, tp=2, pp=2, dp=1))
    load_hf_weights(saved, hf_dir)
    saved_logits = pipeline_forward(saved, ids)
    save_checkpoint(ckpt_dir, saved, hf_dir, extra={"step": 7})
    config = checkpoint_hf_config(ckpt_dir)
    out = {"saved": saved_logits, "loaded": {}, "direct": {}, "extra": {}}
    for tp, dp in [(1, 4), (4, 1)]:
        pg = build_role_groups(ranks, tp=tp, pp=1, dp=dp)
        loaded = build_gpt(config, pg)
        out["extra"][tp] = load_checkpoint(ckpt_dir, loaded)
        direct = build_gpt(hf_dir, pg)
        load_hf_weights(direct, hf_dir)
        out["loaded"][tp] = pipeline_forward(loaded, ids)
        out["direct"][tp] = pipeline_forward(direct, ids)
    return out


def test_tp2pp2_checkpoint_loads_at_tp1_and_tp4(tmp_path):
    model = save_tiny_model("qwen2", tmp_path / "hf", seed=3)  # tied embeddings: the tricky PP case
    vocab = model.config.vocab_size
    ids = token_batch(vocab, seed=3)
    ref = hf_logits(model, ids)
    results = run_distributed(_reshard_rank, 4, args=(str(tmp_path / "hf"), str(tmp_path / "ckpt"), ids))
    assert (tmp_path / "ckpt" / "metadata.json").exists()
    for rank, out in enumerate(results):
        for tp in (1, 4):
            assert out["extra"][tp] == {"step": 7}
            assert torch.equal(out["loaded"][tp], out["direct"][tp]), f"rank {rank} tp{tp}"
            assert (out["loaded"][tp][..., :vocab] - ref).abs().max() <= 1e-4
        if out["saved"] is not None:  # last stage of the TP2 x PP2 model
            assert (out["saved"][..., :vocab] - out["loaded"][1][..., :vocab]).abs().max() <= 1e-4


def _bad_dir_rank(path):
    from megatron_adapters.checkpoint import load_checkpoint

    try:
        load_checkpoint(path, model=None)
    except ValueError as err:
        return str(err)
    return None


def test_load_rejects_a_directory_that_is_no_checkpoint(tmp_path):
    message = _bad_dir_rank(str(tmp_path))
    assert message is not None and message.startswith("ckpt:") and "metadata.json" in message


def _adam_state(role_optimizer) -> list[dict]:
    """Per parameter of this rank's shard: fp32 main param, Adam moments and step (cloned), step's id."""
    inner = role_optimizer.optimizer.optimizer  # RoleOptimizer -> megatron DistributedOptimizer -> torch Adam
    return [
        {"main": p.detach().clone(), "step_id": id(inner.state[p]["step"]),
         **{k: v.clone() for k, v in inner.state[p].items()}}
        for group in inner.param_groups for p in group["params"]
    ]


def _resume_rank(ckpt_dir):
    import os

    from megatron.core import dist_checkpointing

    from megatron_adapters.checkpoint import load_models, save_models, sharded_state
    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.logprobs import token_logprobs
    from megatron_adapters.optimizer import OptimizerSettings, TrainingPrecision, build_optimizer, wrap_for_training
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng
    from tests.megatron_adapters import tiny_gpt

    pgs = build_role_groups([0, 1], tp=1, pp=1, dp=2)  # DP2: the Adam state is sharded over the ranks

    def build():
        seed_role_rng(5, pgs)
        chunks = wrap_for_training([tiny_gpt.tiny_gpt(pgs)], pgs)
        settings = OptimizerSettings(lr=1e-2, weight_decay=0.1)
        return chunks, build_optimizer(chunks, pgs, settings, TrainingPrecision.from_name("fp32"))

    def lm_loss(logits, batch):
        loss = -token_logprobs(logits[:, :-1], batch["input_ids"][:, 1:], pgs.tp).mean()
        return loss, {"loss": loss}

    batches = tiny_gpt.micro_batches(4)[2 * pgs.dp.rank() : 2 * pgs.dp.rank() + 2]

    def train(chunks, optimizer, steps):
        for _ in range(steps):
            optimizer.zero_grad()
            run_forward_backward(chunks, pgs, batches, lm_loss)
            optimizer.step()
        return [p.detach().clone() for p in chunks[0].parameters()]

    chunks, optimizer = build()
    train(chunks, optimizer, 2)
    save_models(ckpt_dir, {"actor": (chunks[0], optimizer.optimizer)})
    # The format written before each role owned its common state: one plain dist checkpoint, rank 0's
    # common state for all.
    legacy_dir = f"{ckpt_dir}/legacy"
    if dist.get_rank() == 0:
        os.makedirs(legacy_dir)
    dist.barrier()
    dist_checkpointing.save({"actor": sharded_state(chunks[0], optimizer.optimizer, prefix="actor.")}, legacy_dir)
    saved = _adam_state(optimizer)
    straight = train(chunks, optimizer, 2)
    chunks, optimizer = build()
    load_models(legacy_dir, {"actor": (chunks[0], optimizer.optimizer)})
    legacy = _adam_state(optimizer)
    chunks, optimizer = build()
    load_models(ckpt_dir, {"actor": (chunks[0], optimizer.optimizer)})
    return saved, _adam_state(optimizer), straight, train(chunks, optimizer, 2), legacy


def test_optimizer_state_round_trips_and_resumed_steps_match_bit_for_bit(tmp_path):
    for saved, loaded, straight, resumed, legacy in run_distributed(_resume_rank, 2, args=(str(tmp_path),)):
        assert len({state["step_id"] for state in loaded}) == len(loaded)  # Adam advances each step itself
        for before, after, old_format in zip(saved, loaded, legacy, strict=True):
            assert after["step"].item() == before["step"].item() == old_format["step"].item() == 2  # continues at 3
            for key in ("main", "exp_avg", "exp_avg_sq"):
                assert torch.equal(after[key], before[key]), key
                assert torch.equal(old_format[key], before[key]), key  # old checkpoints still load
        assert all(torch.equal(a, b) for a, b in zip(straight, resumed, strict=True))


def _optimizer_state(role_optimizer) -> dict:
    """Adam state per parameter (as `_adam_state`) and each param group's lr, of this rank."""
    groups = role_optimizer.optimizer.optimizer.param_groups
    return {"adam": _adam_state(role_optimizer), "lr": [g["lr"] for g in groups]}


def _split_roles_rank(ckpt_dir):
    """Actor on rank 0, critic (PP2) on ranks 1-2, rank 3 in no role: rank 0 holds no critic state at all,
    and rank 3 joins the collective save and load with nothing to save or load."""
    from megatron_adapters.checkpoint import load_models, save_models
    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.optimizer import (
        OptimizerSettings,
        TrainingPrecision,
        build_optimizer,
        join_optimizer_build_elsewhere,
        wrap_for_training,
    )
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng
    from tests.megatron_adapters import tiny_gpt

    actor_pgs = build_role_groups([0], tp=1, pp=1, dp=1)
    critic_pgs = build_role_groups([1, 2], tp=1, pp=2, dp=1)
    if actor_pgs is None and critic_pgs is None:  # the roles' collectives, in their order, with nothing to add
        join_optimizer_build_elsewhere()  # the optimizer builds gather param groups world-wide
        save_models(ckpt_dir, {})
        join_optimizer_build_elsewhere()  # the rebuilds that load
        load_models(ckpt_dir, {})
        return None
    name, pgs = ("actor", actor_pgs) if actor_pgs is not None else ("critic", critic_pgs)
    lr = {"actor": 1e-2, "critic": 3e-3}[name]

    def build():
        seed_role_rng(5, pgs)
        chunks = wrap_for_training([tiny_gpt.tiny_gpt(pgs, tied=False)], pgs)
        return chunks, build_optimizer(chunks, pgs, OptimizerSettings(lr=lr), TrainingPrecision.from_name("fp32"))

    def square_loss(output, batch):  # any scalar of the last stage's output trains every stage
        loss = output.float().pow(2).mean()
        return loss, {"loss": loss}

    chunks, optimizer = build()
    for _ in range(2):
        optimizer.zero_grad()
        run_forward_backward(chunks, pgs, tiny_gpt.micro_batches(2), square_loss)
        optimizer.step()
    save_models(ckpt_dir, {name: (chunks[0], optimizer.optimizer)})
    saved = {"weights": [p.detach().clone() for p in chunks[0].parameters()], **_optimizer_state(optimizer)}
    chunks, optimizer = build()
    for group in optimizer.optimizer.optimizer.param_groups:
        group["lr"] = 0.0  # (megatron matches groups by max_lr, not lr) the loaded lr must be the checkpoint's
    fresh = [p.detach().clone() for p in chunks[0].parameters()]
    load_models(ckpt_dir, {name: (chunks[0], optimizer.optimizer)})
    loaded = {"weights": [p.detach().clone() for p in chunks[0].parameters()], **_optimizer_state(optimizer)}
    return name, lr, fresh, saved, loaded


def test_roles_off_rank0_save_and_load_weights_and_optimizer_state(tmp_path):
    results = run_distributed(_split_roles_rank, 4, args=(str(tmp_path),))
    assert [r[0] for r in results[:3]] == ["actor", "critic", "critic"] and results[3] is None
    for rank, (name, lr, fresh, saved, loaded) in enumerate(results[:3]):
        assert not all(torch.equal(a, b) for a, b in zip(fresh, saved["weights"], strict=True)), rank
        assert all(torch.equal(a, b) for a, b in zip(saved["weights"], loaded["weights"], strict=True)), rank
        assert loaded["lr"] == saved["lr"] and set(loaded["lr"]) == {lr}, rank
        assert saved["adam"] and len(saved["adam"]) == len(loaded["adam"]), rank
        for before, after in zip(saved["adam"], loaded["adam"], strict=True):
            assert after["step"].item() == before["step"].item() == 2, rank
            for key in ("main", "exp_avg", "exp_avg_sq"):
                assert torch.equal(after[key], before[key]), (rank, name, key)


def _new_schedule_rank(ckpt_dir):
    """Train 2 steps at lr 1e-2 (linear decay over 10 steps, weight decay 0.1), save; rebuild at lr 4e-3 over
    20 steps with weight decay 0.05 and load: the config's schedule applies from the checkpoint's step on."""
    from megatron_adapters.checkpoint import load_models, save_models
    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.optimizer import OptimizerSettings, TrainingPrecision, build_optimizer, wrap_for_training
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng
    from tests.megatron_adapters import tiny_gpt

    pgs = build_role_groups([0, 1], tp=1, pp=1, dp=2)

    def build(settings):
        seed_role_rng(5, pgs)
        chunks = wrap_for_training([tiny_gpt.tiny_gpt(pgs)], pgs)
        return chunks, build_optimizer(chunks, pgs, settings, TrainingPrecision.from_name("fp32"))

    def square_loss(output, batch):
        loss = output.float().pow(2).mean()
        return loss, {"loss": loss}

    old = OptimizerSettings(lr=1e-2, weight_decay=0.1, lr_decay_style="linear", lr_decay_steps=10)
    chunks, optimizer = build(old)
    for _ in range(2):
        optimizer.zero_grad()
        run_forward_backward(chunks, pgs, tiny_gpt.micro_batches(2), square_loss)
        optimizer.step()
    save_models(ckpt_dir, {"actor": (chunks[0], optimizer.optimizer)})
    scheduler_state = optimizer.scheduler.state_dict()
    saved = _adam_state(optimizer)
    new = OptimizerSettings(lr=4e-3, weight_decay=0.05, lr_decay_style="linear", lr_decay_steps=20)
    chunks, optimizer = build(new)
    load_models(ckpt_dir, {"actor": (chunks[0], optimizer.optimizer)})
    optimizer.scheduler.load_state_dict(scheduler_state)
    groups = optimizer.optimizer.optimizer.param_groups
    return saved, _adam_state(optimizer), [(g["lr"], g["weight_decay"], g.get("wd_mult", 1.0)) for g in groups]


def test_resume_takes_a_new_learning_rate_and_weight_decay_from_the_config(tmp_path):
    for saved, loaded, groups in run_distributed(_new_schedule_rank, 2, args=(str(tmp_path),)):
        # linear decay to 0 over 20 steps, at the checkpoint's step 2: 4e-3 * (1 - 2 / 20)
        assert all(lr == pytest.approx(4e-3 * 0.9, rel=1e-6) for lr, _, _ in groups), groups
        assert {wd for _, wd, _ in groups} == {0.05 * mult for _, _, mult in groups} and {0.0, 0.05} >= {
            wd for _, wd, _ in groups}
        for before, after in zip(saved, loaded, strict=True):  # the Adam state is the checkpoint's
            assert after["step"].item() == before["step"].item() == 2
            for key in ("main", "exp_avg", "exp_avg_sq"):
                assert torch.equal(after[key], before[key]), key
