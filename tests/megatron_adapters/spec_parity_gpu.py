"""GPU check run as a subprocess by test_specs_gpu.py: the fused-attention spec ("sdpa", or "te" when
importable) gives the same bf16 logits as megatron's unfused local spec for the same weights."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from megatron_adapters.model import build_gpt  # noqa: E402
from megatron_adapters.process_groups import build_role_groups, seed_role_rng  # noqa: E402
from tests.megatron_adapters.tiny_hf_models import LLAMA  # noqa: E402


def main(out: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    # the tests' tiny Llama, widened so the fused kernels see a realistic head_dim (32) and a 256-token sequence
    cfg = LlamaConfig(**{**LLAMA, "hidden_size": 256, "intermediate_size": 512, "num_key_value_heads": 2,
                         "vocab_size": 1000, "max_position_embeddings": 256})
    pg = build_role_groups([0], 1, 1, 1)
    ids = torch.randint(0, 1000, (2, 256), device="cuda")
    pos = torch.arange(256, device="cuda").expand(2, 256)
    logits = {}
    reference = None
    for spec in ("local", "sdpa", "auto"):
        seed_role_rng(7, pg)
        model = build_gpt(cfg, pg, dtype=torch.bfloat16, spec=spec)
        if reference is None:
            reference = model.state_dict()
        else:
            model.load_state_dict(reference, strict=False)
        with torch.no_grad():
            logits[spec] = (model.spec_name, model(ids, pos, None).float()[..., :1000])
    base = logits["local"][1]
    result = {
        spec: {
            "spec_name": name,
            "max_abs_diff": (x - base).abs().max().item(),
            "scale": base.abs().max().item(),
        }
        for spec, (name, x) in logits.items()
    }
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
