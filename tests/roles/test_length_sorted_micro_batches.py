"""Micro-batches of rows sorted by length, each cut to its own width (hybridflow.roles.micro_batching): forward
results come back in row order and equal the full-width ones, and the update's gradient equals that of
micro-batches in row order at the full width (CPU, gloo, fp32, one rank)."""

import torch

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model

LENGTHS = [30, 170, 60, 100, 45, 150, 80, 20]  # prompt + response of each row
SEQ = 192


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 200, (len(LENGTHS), SEQ), generator=torch.Generator().manual_seed(7))
    mask = torch.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        prompt = 8 + row
        mask[row, prompt:length] = 1
        ids[row, length:] = 0
    return {"input_ids": ids, "loss_mask": mask, "seq_lens": torch.tensor(LENGTHS)}


def _run(hf_dir: str) -> dict:
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import OptimizerSettings, build_model_role, per_token_logprobs
    from megatron_adapters.checkpoint import unwrap
    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.process_groups import build_role_groups

    groups = build_role_groups([0], tp=1, pp=1, dp=1)
    mesh = RoleMesh("actor", (0,), ParallelDims(1, 1, 1))
    actor = build_model_role("actor", mesh, groups, hf_dir, "lm", torch.float32, 2, OptimizerSettings(lr=1e-3),
                             seed=1)
    tokens = float(_batch()["loss_mask"].sum())

    def loss(logits, mb):  # a mini-batch-wide token mean: the sum over micro-batches is the same however they split
        logp, ent = actor.logprobs(logits, mb["input_ids"], with_entropy=True, positions=mb.get("logit_positions"))
        m = mb["loss_mask"].float()
        return -((logp + 0.1 * ent) * m).sum() / tokens, {"num_tokens": m.sum()}

    out = {}
    for name, tensors in (("sorted", _batch()), ("in_order", {k: v for k, v in _batch().items() if k != "seq_lens"})):
        micro = actor.micro_batches(tensors)
        out[name] = {"widths": [mb["input_ids"].shape[1] for mb in micro],
                     "rows": [mb["row_index"].tolist() for mb in micro if "row_index" in mb],
                     "logp": actor.forward(tensors, per_token_logprobs(actor, 1.0))}
        actor.optimizer.zero_grad()
        run_forward_backward([actor.model], groups, micro, loss)
        out[name]["grads"] = {n: p.main_grad.clone() for n, p in unwrap(actor.model).named_parameters()}
    return out


def test_length_sorted_micro_batches_match_full_width_ones(tmp_path):
    save_tiny_model("llama", tmp_path, max_position_embeddings=256)
    (out,) = run_distributed(_run, world_size=1, args=(str(tmp_path),))
    sorted_, in_order = out["sorted"], out["in_order"]
    # lengths 20, 30 | 45, 60 | 80, 100 | 150, 170, each pair cut to a multiple of 64 columns
    assert sorted_["rows"] == [[7, 0], [4, 2], [6, 3], [5, 1]]
    assert sorted_["widths"] == [64, 64, 128, 192]
    assert in_order["widths"] == [SEQ] * 4 and in_order["rows"] == []
    mask = _batch()["loss_mask"].bool()
    assert in_order["logp"][mask].abs().min() > 0
    torch.testing.assert_close(sorted_["logp"], in_order["logp"], rtol=1e-5, atol=1e-6)
    for name, grad in in_order["grads"].items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(sorted_["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
