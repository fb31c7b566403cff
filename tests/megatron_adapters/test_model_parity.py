"""Megatron GPTModel logits == HF transformers logits (fp32, max abs diff <= 1e-4) at TP {1,2,4} x PP {1,2}.

One forked launch per world size checks every (model, layout) of that size: a GQA Llama with llama3 rope
scaling, a Qwen2 with qkv bias, tied embeddings and a vocabulary (250) divisible by neither TP nor 128,
a Mistral whose sliding window (5) is shorter than the sequence (12), and a Qwen3 with per-head q/k norms and
head_dim 16 != hidden / heads = 8.

World size 8 (TP4 x PP2) runs only on GPUs: with `HYBRIDFLOW_TEST_DEVICE=cuda` and at least 8 of them
(benchmarks/multigpu.sh on an 8-GPU node); everywhere else, CPU CI included, it is skipped (8 gloo ranks of
megatron are too heavy for the CPU runners). The ranks build on `compute_device()`, so the same code runs on
gloo (CPU) and nccl (rank r on GPU r, TF32 off: the fp32 tolerance holds there too).
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.distributed_harness import default_device, run_distributed
from tests.megatron_adapters.tiny_hf_models import KINDS, hf_logits, pipeline_forward, save_tiny_model, token_batch

TOLERANCE = 1e-4
LAYOUTS = {1: [(1, 1)], 2: [(2, 1), (1, 2)], 4: [(4, 1), (2, 2)], 8: [(4, 2)]}


def _has_8_gpus() -> bool:
    # default_device() first: CPU runs never touch CUDA here.
    return default_device() == "cuda" and torch.cuda.device_count() >= 8


EIGHT_GPUS = pytest.param(
    8,
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not _has_8_gpus(), reason="needs 8 GPUs (benchmarks/multigpu.sh)"),
    ],
    id="8-tp4_pp2",
)


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    cases = {}
    for kind in KINDS:  # every family the tiny-model factory builds
        path = tmp_path_factory.mktemp(kind)
        model = save_tiny_model(kind, path, seed=1)
        ids = token_batch(model.config.vocab_size)
        cases[kind] = (str(path), ids, hf_logits(model, ids), model.config.vocab_size)
    return cases


def _parity_rank(cases, layouts):
    from megatron_adapters.cpu_backend import compute_device
    from megatron_adapters.hf_safetensors import load_hf_weights
    from megatron_adapters.model import build_gpt, model_shape
    from megatron_adapters.process_groups import build_role_groups

    world = dist.get_world_size()
    device = compute_device()  # the CPU under gloo, this rank's GPU under nccl (where build_gpt puts the model)
    report = []
    for kind, (path, ids, ref, vocab) in cases.items():
        ids, ref = ids.to(device), ref.to(device)  # no-ops where the harness already moved them
        for tp, pp in layouts:
            pg = build_role_groups(list(range(world)), tp=tp, pp=pp, dp=world // (tp * pp))
            model = build_gpt(path, pg, spec="sdpa")
            assert model.hf_shape == model_shape(path)
            load_hf_weights(model, path)
            logits = pipeline_forward(model, ids)
            loss_diff = None
            if pp == 1:  # vocab-parallel cross entropy over the padded vocab == HF's CE; backward runs
                position_ids = torch.arange(ids.shape[1], device=device).expand_as(ids)
                loss = model(ids, position_ids, None, labels=ids)
                hf_loss = F.cross_entropy(ref.reshape(-1, vocab), ids.reshape(-1), reduction="none")
                loss_diff = (loss.reshape(-1) - hf_loss).abs().max().item()
                loss.sum().backward()
                assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
            if logits is not None and pg.tp.rank() == 0 and pg.dp.rank() == 0:
                diff = (logits[..., :vocab] - ref).abs().max().item()
                padded_max = logits[..., vocab:].max().item() if logits.shape[-1] > vocab else None
                report.append((kind, tp, pp, diff, tuple(logits.shape), padded_max, loss_diff))
    return report


@pytest.mark.parametrize("world_size", [1, 2, 4, EIGHT_GPUS])
def test_logits_match_hf(hf_models, world_size):
    reports = [
        r
        for rank in run_distributed(_parity_rank, world_size, args=(hf_models, LAYOUTS[world_size]))
        for r in rank
    ]
    seen = {(kind, tp, pp) for kind, tp, pp, *_ in reports}
    assert seen == {(k, tp, pp) for k in hf_models for tp, pp in LAYOUTS[world_size]}
    for kind, tp, pp, diff, shape, padded_max, loss_diff in reports:
        assert diff <= TOLERANCE, f"{kind} tp{tp} pp{pp}: max abs diff {diff}"
        assert pp != 1 or loss_diff <= TOLERANCE, f"{kind} tp{tp}: per-token loss differs by {loss_diff}"
        assert shape[-1] % (128 * tp) == 0
        if padded_max is not None:  # padded vocab columns can never win a softmax
            assert padded_max < -1e29, f"{kind} tp{tp} pp{pp}: padded logits not masked"
