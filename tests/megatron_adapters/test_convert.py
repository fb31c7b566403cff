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


def test_cli_roundtrip_is_bit_exact(tmp_path, capfd):  # capfd: the launcher's ranks write to real fds
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
    assert "converted" in capfd.readouterr().out
    original, back = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert set(back) == set(original)
    assert all(torch.equal(back[k], v) for k, v in original.items())
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == [
        "Qwen2ForCausalLM"
    ]


def _exit_line(argv, capture):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capture.readouterr().err
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
    from tests.trainer.checkpoint_dirs import checkpoint_of

    training = checkpoint_of(tmp_path / "run", "tiny_cpu", 2)  # before: "has no hf_config/", as if not ours
    err = _exit_line(["mcore-to-hf", "--ckpt", str(training), "--out", str(tmp_path / "o")], capsys)
    assert err.startswith(f"error: --ckpt: {training} is a training checkpoint") and "final_hf/" in err


def test_bad_input_found_inside_a_rank_is_one_line_and_exit_2(tmp_path, capfd):
    save_tiny_model("qwen2", tmp_path / "hf", seed=11)
    (tmp_path / "hf" / "model.safetensors").unlink()  # config.json passes the parent's checks; loading fails
    err = _exit_line(["hf-to-mcore", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "o"), "--tp", "2"],
                     capfd)
    assert err.startswith("error: hf: ") and "has neither model.safetensors" in err, err


def test_mcore_to_vllm_writes_one_shard_per_rank(tmp_path, capfd):
    from safetensors import safe_open

    save_tiny_model("llama", tmp_path / "hf", seed=5)
    assert main(["hf-to-mcore", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "ckpt")]) == 0
    for source in ("ckpt", "hf"):  # a dist checkpoint, and an HF directory
        out = tmp_path / f"vllm_{source}"
        assert main(["mcore-to-vllm", "--ckpt", str(tmp_path / source), "--out", str(out), "--tp", "2"]) == 0
        manifest = json.loads((out / "vllm_shards.json").read_text())
        assert manifest["tp"] == 2 and (out / "config.json").exists()
        for rank in range(2):
            with safe_open(str(out / f"rank{rank}.safetensors"), "pt") as f:
                assert {k: list(f.get_slice(k).get_shape()) for k in f.keys()} == manifest["tensors"][str(rank)]
        qkv = manifest["tensors"]["0"]["model.layers.0.self_attn.qkv_proj.weight"]
        assert qkv == [(8 + 2 * 4) * 8 // 2, 64]  # (q heads + k + v) x head_dim / tp, hidden
    assert "mcore-to-vllm, tp=2" in capfd.readouterr().out
    assert not list(tmp_path.glob(".*.partial"))


def test_mcore_to_vllm_bad_input_is_one_line(tmp_path, capsys):
    save_tiny_model("llama", tmp_path / "hf")
    vllm = ["mcore-to-vllm", "--out", str(tmp_path / "o")]
    assert _exit_line([*vllm, "--ckpt", str(tmp_path / "none"), "--tp", "2"], capsys).startswith("error: --ckpt:")
    err = _exit_line([*vllm, "--ckpt", str(tmp_path / "hf"), "--tp", "3"], capsys)
    assert err.startswith("error: --tp: 3 cannot shard"), err
    assert _exit_line([*vllm, "--ckpt", str(tmp_path / "hf"), "--tp", "0"], capsys).startswith("error: --tp:")
    assert _exit_line([*vllm[:1], "--ckpt", str(tmp_path / "hf"), "--tp", "2", "--out", str(tmp_path / "hf")],
                      capsys).startswith("error: --out:")
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".*.partial"))
