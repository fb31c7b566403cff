"""Record the parameter names and shapes that vLLM's own model classes hold after `load_weights`.

Run with a Python that has vLLM installed (not the project's venv; see tests/rollout/test_vllm_engine.py):

    python tests/rollout/data/record_vllm_param_shapes.py [--out tests/rollout/data/vllm_param_shapes.json]

For each tiny model (a GQA Llama with untied embeddings, a Qwen2 with qkv bias, one KV head and tied
embeddings, a Qwen3 with q/k norms and head_dim 32 != hidden / heads) and each TP size (1, 2) it forks TP
gloo ranks on CPU, builds vLLM's model class inside vLLM's own parallel state, loads a random HF checkpoint
through `model.load_weights`, and checks every parameter against a reconstruction written from the layout
rules alone (qkv = [q; k; v] of this rank, gate_up = [gate; up], vocab padded to 64 and split in rows, o/down
split on the input dim). The JSON it writes lets CI
check the bridge's vLLM layout without vLLM installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for hybridflow
from hybridflow.launch.ports import free_port  # noqa: E402 (needs the path above)

VOCAB_PAD = 64  # vLLM's VocabParallelEmbedding pads the vocabulary to a multiple of this

TINY_MODELS = {
    "llama_gqa": dict(
        architecture="LlamaForCausalLM",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        tie_word_embeddings=False,
    ),
    "qwen2_tied_kv1": dict(
        architecture="Qwen2ForCausalLM",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        vocab_size=130,
        tie_word_embeddings=True,
    ),
    # q/k RMSNorms per head and an explicit head_dim unlike hidden / heads (as Qwen3's checkpoints have)
    "qwen3_head_dim32": dict(
        architecture="Qwen3ForCausalLM",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=100,
        tie_word_embeddings=True,
    ),
}


def write_hf_checkpoint(spec: dict, out_dir: Path) -> dict[str, torch.Tensor]:
    """Save a random HF model of `spec` (the tests' tiny-model factory, these shapes) to out_dir and return
    its state dict."""
    from tests.megatron_adapters.tiny_hf_models import save_tiny_model

    kind = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}[spec["architecture"]]
    fields = {k: v for k, v in spec.items() if k != "architecture"}
    model = save_tiny_model(kind, out_dir, max_position_embeddings=128, **fields)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def expected_shard(name: str, hf: dict[str, torch.Tensor], spec: dict, tp: int, rank: int) -> torch.Tensor:
    """This TP rank's tensor for vLLM parameter `name`, built from the HF weights by the layout rules."""
    heads, kv_heads = spec["num_attention_heads"], spec["num_key_value_heads"]
    head_dim = spec.get("head_dim", spec["hidden_size"] // heads)

    def rows(t: torch.Tensor, parts: int, index: int) -> torch.Tensor:
        return t.chunk(parts, dim=0)[index]

    def kv_rows(t: torch.Tensor) -> torch.Tensor:
        # kv heads are split when there are at least tp of them, else each head serves tp // kv_heads ranks
        if kv_heads >= tp:
            return rows(t, tp, rank)
        return rows(t, kv_heads, rank // (tp // kv_heads))

    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        src = hf.get(name, hf["model.embed_tokens.weight"])
        padded = -(-src.shape[0] // VOCAB_PAD) * VOCAB_PAD
        full = torch.zeros(padded, src.shape[1], dtype=src.dtype)
        full[: src.shape[0]] = src
        return rows(full, tp, rank)
    prefix, _, leaf = name.rpartition(".")
    if ".self_attn.qkv_proj" in name:
        base = prefix.removesuffix(".qkv_proj")
        q = hf[f"{base}.q_proj.{leaf}"]
        k, v = hf[f"{base}.k_proj.{leaf}"], hf[f"{base}.v_proj.{leaf}"]
        assert q.shape[0] == heads * head_dim
        return torch.cat([rows(q, tp, rank), kv_rows(k), kv_rows(v)])
    if ".mlp.gate_up_proj" in name:
        base = prefix.removesuffix(".gate_up_proj")
        return torch.cat([rows(hf[f"{base}.gate_proj.{leaf}"], tp, rank), rows(hf[f"{base}.up_proj.{leaf}"], tp, rank)])
    if name.endswith((".self_attn.o_proj.weight", ".mlp.down_proj.weight")):
        return hf[name].chunk(tp, dim=1)[rank]
    return hf[name]  # norms (also Qwen3's per-head q/k norms): whole on every rank


def rank_main(rank: int, tp: int, port: int, spec: dict, ckpt: str, hf: dict, out: dict) -> None:
    """Build vLLM's model on this CPU rank, load the HF checkpoint, record and check every parameter."""
    try:
        from safetensors.torch import load_file
        from vllm.config import (
            DeviceConfig,
            LoadConfig,
            ModelConfig,
            ParallelConfig,
            VllmConfig,
            set_current_vllm_config,
        )
        from vllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
        from vllm.model_executor.models.registry import ModelRegistry

        model_config = ModelConfig(model=ckpt, dtype="float32", skip_tokenizer_init=True, enforce_eager=True)
        vllm_config = VllmConfig(
            model_config=model_config,
            parallel_config=ParallelConfig(tensor_parallel_size=tp),
            load_config=LoadConfig(load_format="dummy"),
            device_config=DeviceConfig(device="cpu"),
        )
        with set_current_vllm_config(vllm_config):
            init_distributed_environment(
                world_size=tp,
                rank=rank,
                distributed_init_method=f"tcp://127.0.0.1:{port}",
                local_rank=rank,
                backend="gloo",
            )
            initialize_model_parallel(tensor_model_parallel_size=tp, backend="gloo")
            model_cls, _ = ModelRegistry.resolve_model_cls(spec["architecture"], model_config=model_config)
            with torch.device("cpu"):
                model = model_cls(vllm_config=vllm_config, prefix="")
            weights = load_file(str(Path(ckpt) / "model.safetensors"))
            loaded = model.load_weights(iter(weights.items()))
        params = dict(model.named_parameters())
        mismatches = []
        for name, param in params.items():
            want = expected_shard(name, hf, spec, tp, rank)
            if want.shape != param.shape or not torch.equal(want, param.detach()):
                mismatches.append(f"{name}: vllm {tuple(param.shape)} vs rule {tuple(want.shape)}")
        # copying rule-built shards into the parameters (what the engine host does) must reproduce vLLM's loader
        loaded_values = {n: p.detach().clone() for n, p in params.items()}
        with torch.no_grad():
            for p in params.values():
                p.zero_()
            for n, p in params.items():
                p.copy_(expected_shard(n, hf, spec, tp, rank))
        mismatches += [
            f"{n}: in-place write differs from load_weights"
            for n, p in params.items()
            if not torch.equal(p.detach(), loaded_values[n])
        ]
        out[rank] = {
            "params": {n: list(p.shape) for n, p in params.items()},
            "loaded": sorted(loaded) if loaded is not None else None,
            "mismatches": mismatches,
        }
    except Exception:  # reported by the parent; a child traceback alone is easy to miss
        out[rank] = {"error": traceback.format_exc()}


def record(tp: int, spec: dict) -> dict:
    """Run one (model, tp) case in `tp` spawned ranks and return per-rank results."""
    with tempfile.TemporaryDirectory() as tmp:
        hf = write_hf_checkpoint(spec, Path(tmp))
        # spawn, not fork: a parent that imported vLLM has already fixed its platform (not CPU)
        ctx = mp.get_context("spawn")
        manager = ctx.Manager()
        out = manager.dict()
        port = free_port("127.0.0.1")
        procs = [ctx.Process(target=rank_main, args=(r, tp, port, spec, tmp, hf, out)) for r in range(tp)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=600)
        return {r: out.get(r, {"error": f"rank {r} exited with {p.exitcode}"}) for r, p in enumerate(procs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).with_name("vllm_param_shapes.json")))
    args = parser.parse_args()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import vllm

    result: dict = {
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "vocab_pad": VOCAB_PAD,
        "models": {},
    }
    failed = False
    for key, spec in TINY_MODELS.items():
        result["models"][key] = {"hf_config": spec, "tp": {}}
        for tp in (1, 2):
            ranks = record(tp, spec)
            for r, res in ranks.items():
                if "error" in res or res["mismatches"]:
                    failed = True
                    print(
                        f"{key} tp{tp} rank{r}:",
                        res.get("error") or "\n".join(res["mismatches"]),
                        file=sys.stderr,
                    )
            result["models"][key]["tp"][str(tp)] = {str(r): res.get("params") for r, res in ranks.items()}
            print(f"{key} tp{tp}: " + ("FAILED" if failed else "all parameters match the layout rules"))
    if failed:
        return 1
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
