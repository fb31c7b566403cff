"""The model-family registry: lookups by name, refused duplicates, a leaf package, and a family registered by
user code is planned like a built-in one."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.errors import UserError
from hybridflow.families import (
    ModelFamily,
    causal_lm_architectures,
    decoder_layer_weights,
    family,
    family_for_architecture,
    family_for_gguf,
    register_family,
    shape_from_hf,
    supported_architectures,
)

REPO = Path(__file__).resolve().parents[2]
LEAVES = ("hybridflow.families", "hybridflow.registry", "hybridflow.errors")


def test_lookups_by_every_name():
    qwen3 = family("qwen3")
    assert family_for_architecture("Qwen3ForCausalLM") is qwen3
    assert family_for_architecture("Qwen3ForSequenceClassification") is qwen3
    assert qwen3.qk_norm and not qwen3.qkv_bias and family("qwen2").qkv_bias
    assert family_for_gguf("qwen3") is qwen3 and family_for_gguf("mistral") is None
    assert set(causal_lm_architectures()) == {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                              "Qwen3ForCausalLM"}
    assert len(supported_architectures()) == 2 * len(causal_lm_architectures())
    with pytest.raises(UserError, match="^model_type: 'gpt2' is unknown; use one of llama, mistral, qwen2, qwen3$"):
        family("gpt2")
    with pytest.raises(UserError, match="^architectures: 'GPT2LMHeadModel' is unknown; use one of LlamaForCausalLM"):
        family_for_architecture("GPT2LMHeadModel")


def test_a_second_registration_of_a_name_is_refused():
    twin = ModelFamily("qwen3", "Qwen3TwinForCausalLM", "Qwen3TwinForSequenceClassification", decoder_layer_weights)
    with pytest.raises(ValueError, match="^register_family: qwen3 already registered"):
        register_family(twin)
    assert family("qwen3").causal_lm == "Qwen3ForCausalLM"


def test_head_dim_is_the_checkpoint_key_else_hidden_over_heads():
    base = dict(architectures=["Qwen3ForCausalLM"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=96, vocab_size=100)
    assert shape_from_hf({**base, "head_dim": 32}).head_dim == 32
    assert shape_from_hf(base).head_dim == 16
    assert shape_from_hf({**base, "head_dim": None}).head_dim == 16


def test_families_is_a_leaf_package():
    """hybridflow.config and hybridflow.placement import it, so it may import only the standard library,
    itself and the leaves hybridflow.registry and hybridflow.errors (never megatron_adapters, the trainer,
    roles or rollout, nor torch/transformers)."""
    stdlib = set(sys.stdlib_module_names)
    for path in (REPO / "hybridflow" / "families").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] in stdlib or name.startswith(LEAVES), (path.name, name)


USER_FAMILY = """
from hybridflow.families import ModelFamily, decoder_layer_weights, register_family
register_family(ModelFamily("myllama", "MyLlamaForCausalLM", "MyLlamaForSequenceClassification",
                            decoder_layer_weights, qk_norm=True))
from hybridflow.config import load_experiment
from hybridflow.placement.memory import stage_params
cfg = load_experiment("tiny_cpu", ["model.architecture=MyLlamaForCausalLM"])
plain = load_experiment("tiny_cpu", [])
print(stage_params(cfg.model, "actor", 1, 1, 0) - stage_params(plain.model, "actor", 1, 1, 0))
"""


def test_a_family_registered_by_user_code_is_planned():
    out = subprocess.run([sys.executable, "-c", USER_FAMILY], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert out.returncode == 0, out.stderr
    model = __import__("hybridflow.config", fromlist=["load_experiment"]).load_experiment("tiny_cpu", []).model
    # its q/k norms: two [head_dim] weights per layer
    assert int(out.stdout.strip()) == model.num_hidden_layers * 2 * model.attention_head_dim
