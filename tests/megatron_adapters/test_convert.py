"""`python -m hybridflow.convert`: HF -> dist ckpt (TP2 x PP2) -> HF (TP2) is bit-exact; bad input exits 2."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2Config

from hybridflow.convert import main
from tests.megatron_adapters.tiny_hf_models import save_tiny_model


def _tensors(path):
    index = path / "model.safetensors.index.json"
    files = (
        set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else {"model.safetensors"}
    )
    return {k: v for f in files for k, v in load_file(path / f).items()}


@pytest.mark.slow
def test_cli_roundtrip_is_bit_exact(tmp_path, capsys):
    save_tiny_model("qwen2", tmp_path / "hf", seed=11)
    assert (
        main(
            [
                "hf-to-mcore",
                "--hf",
                str(tmp_path / "hf"),
                "--out",
                str(tmp_path / "ckpt"),
                "--tp",
                "2",
                "--pp",
                "2",
            ]
        )
        == 0
    )
    assert (tmp_path / "ckpt" / "metadata.json").exists()
    assert (
        main(["mcore-to-hf", "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "back"), "--tp", "2"])
        == 0
    )
    assert "converted" in capsys.readouterr().out
    original, back = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert set(back) == set(original)
    assert all(torch.equal(back[k], v) for k, v in original.items())
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == [
        "Qwen2ForCausalLM"
    ]


def _exit_line(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # (import warnings aside)
    assert exc.value.code == 2 and len(errors) == 1 and "Traceback" not in err
    return errors[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert _exit_line(
        ["hf-to-mcore", "--hf", str(tmp_path / "none"), "--out", str(tmp_path / "o")], capsys
    ).startswith("error: --hf:")
    GPT2Config(architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path / "gpt2")
    err = _exit_line(["hf-to-mcore", "--hf", str(tmp_path / "gpt2"), "--out", str(tmp_path / "o")], capsys)
    assert "GPT2LMHeadModel" in err and "LlamaForCausalLM" in err
    save_tiny_model("llama", tmp_path / "llama")
    err = _exit_line(
        ["hf-to-mcore", "--hf", str(tmp_path / "llama"), "--out", str(tmp_path / "o"), "--tp", "3"], capsys
    )
    assert err.startswith("error: tp: 3 must divide")
    err = _exit_line(
        ["hf-to-mcore", "--hf", str(tmp_path / "llama"), "--out", str(tmp_path / "llama")], capsys
    )
    assert err.startswith("error: --out:")
    err = _exit_line(["mcore-to-hf", "--ckpt", str(tmp_path / "llama"), "--out", str(tmp_path / "o")], capsys)
    assert err.startswith("error: --ckpt:")
