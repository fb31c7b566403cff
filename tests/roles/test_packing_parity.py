"""Sequence packing changes no number: log-probs, values, the actor and critic losses and their gradients from
packed micro-batches (megatron's thd layout through our SDPA core attention, PackedSeqParams, variable
shapes between pipeline stages) equal those of the padded micro-batches, at TP2 and at PP2 (CPU, gloo, fp32).

The padded path is the reference: it is what the HF-parity tests check against transformers.
"""

import pytest
import torch

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model

LENGTHS = (16, 5, 9, 3, 12, 7)  # true lengths of the 6 rows (prompt + response); the batch is 16 wide
PROMPTS = (4, 2, 3, 2, 4, 3)
BUDGET = 20  # packs [16+3], [12+7], [9+5]: three micro-batches of 19, 19 and 14 tokens
# (loss_agg_mode, algorithm.name); gspo: one ratio per sequence (a packed micro-batch once got one per pack)
LOSS_MODES = {"token-mean": ("token-mean", "ppo"), "seq-mean-token-mean": ("seq-mean-token-mean", "ppo"),
              "gspo": ("seq-mean-token-mean", "gspo")}
MODES = tuple(LOSS_MODES)


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    rows, width = len(LENGTHS), max(LENGTHS)
    ids = torch.randint(3, vocab, (rows, width), generator=gen)
    mask = torch.zeros(rows, width)
    for r, (n, p) in enumerate(zip(LENGTHS, PROMPTS, strict=True)):
        ids[r, n:] = 0  # right padding
        mask[r, p:n] = 1.0
    per_token = {k: torch.randn(rows, width, generator=gen) * mask
                 for k in ("old_logprobs", "advantages", "values", "returns")}
    per_token["old_logprobs"] = per_token["old_logprobs"].abs().neg() - 1.0
    return {"input_ids": ids, "loss_mask": mask, "seq_lens": torch.tensor(LENGTHS), **per_token}


def _parity(hf_dir: str, tp: int, pp: int, batch: dict[str, torch.Tensor]) -> dict:
    from hybridflow.algorithms import build_algorithm
    from hybridflow.config import ExperimentConfig
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import (
        OptimizerSettings,
        build_model_role,
        per_token_logprobs,
        per_token_values,
    )
    from hybridflow.trainer.rl_trainer import RLTrainer
    from megatron_adapters.checkpoint import unwrap
    from megatron_adapters.cpu_backend import compute_device
    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.process_groups import build_role_groups

    groups = build_role_groups([0, 1], tp=tp, pp=pp, dp=1)
    mesh = RoleMesh("actor", (0, 1), ParallelDims(tp, pp, 1))
    settings = OptimizerSettings(lr=1e-3)
    actor = build_model_role("actor", mesh, groups, hf_dir, "lm", torch.float32, 2, optimizer=settings, seed=1)
    critic = build_model_role("critic", mesh, groups, hf_dir, "value", torch.float32, 2, optimizer=settings, seed=1)
    cfg = ExperimentConfig()
    cfg.algorithm.entropy_coef = 0.01  # the entropy term back-propagates too
    trainer = RLTrainer(cfg=cfg, roles={"actor": actor, "critic": critic}, meshes={}, rollout=None, scorer=None,
                        kl_ctl=None, algorithm=build_algorithm(cfg), device=compute_device(), training=None)
    out: dict = {}
    for layout, budget in (("padded", 0), ("packed", BUDGET)):
        res = out[layout] = {}
        for role in (actor, critic):
            role.max_tokens_per_micro_batch = budget
        res["logprobs"] = actor.forward(batch, per_token_logprobs(actor, 0.7))
        res["values"] = critic.forward(batch, per_token_values)
        for mode in MODES:
            cfg.algorithm.loss_agg_mode, cfg.algorithm.name = LOSS_MODES[mode]
            cfg.roles.critic.enabled = cfg.algorithm.name == "ppo"  # the critic's loss below runs either way
            cfg.rollout.n_samples_per_prompt = 1 if cfg.algorithm.name == "ppo" else 2  # the batch is given
            trainer.algorithm = build_algorithm(cfg)
            for name, role, loss_fn in (("actor", actor, trainer._actor_loss(0.7)),
                                        ("critic", critic, trainer._critic_loss)):
                micro = role.micro_batches(batch)
                scale = trainer._loss_scale(role, batch["loss_mask"], len(micro))
                losses, n = [], len(micro)

                def fn(output, mb, loss_fn=loss_fn, scale=scale, losses=losses, n=n):
                    loss, metrics = loss_fn(output, mb, scale)
                    losses.append(loss.detach() / n)  # what megatron sums
                    return loss, metrics

                role.model.train()
                role.optimizer.zero_grad()
                metrics = run_forward_backward([role.model], groups, micro, fn)
                res[(name, mode, "n_micro")] = len(micro)
                res[(name, mode, "loss")] = torch.stack(losses).sum() if losses else None
                res[(name, mode, "metrics")] = {k: sum(m[k] for m in metrics) for k in metrics[0]}
                res[(name, mode, "grads")] = {n: p.main_grad.detach().clone()
                                              for n, p in unwrap(role.model).named_parameters()}
    return out


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_packed_equals_padded(tmp_path, tp, pp):
    hf = save_tiny_model("llama", tmp_path)
    batch = _batch(hf.config.vocab_size)
    valid = torch.arange(batch["input_ids"].shape[1])[None, :] < batch["seq_lens"][:, None]
    for rank, out in enumerate(run_distributed(_parity, world_size=2, args=(str(tmp_path), tp, pp, batch))):
        padded, packed = out["padded"], out["packed"]
        assert packed[("actor", "token-mean", "n_micro")] == 3 and padded[("actor", "token-mean", "n_micro")] == 3
        for key in ("logprobs", "values"):
            assert packed[key].abs().max() > 0
            # columns after a row's end are padding (the padded path computes something there; unused)
            torch.testing.assert_close(packed[key][valid], padded[key][valid], rtol=1e-5, atol=1e-5)
            assert torch.all(packed[key][~valid] == 0) and torch.all(packed[key][:, 0] == 0)
        for name in ("actor", "critic"):
            for mode in MODES:
                if padded[(name, mode, "loss")] is not None:  # on the last pipeline stage
                    torch.testing.assert_close(packed[(name, mode, "loss")], padded[(name, mode, "loss")],
                                               rtol=1e-5, atol=1e-6)
                for k, v in padded[(name, mode, "metrics")].items():
                    torch.testing.assert_close(packed[(name, mode, "metrics")][k], v, rtol=1e-5, atol=1e-5,
                                               msg=f"{name} {mode} {k}")
                grads, ref = packed[(name, mode, "grads")], padded[(name, mode, "grads")]
                assert grads.keys() == ref.keys()
                for n, g in ref.items():
                    assert g.abs().max() > 0, (rank, name, n)
                    torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-6, msg=f"rank {rank} {name} {n}")
