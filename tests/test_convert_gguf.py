"""`python -m hybridflow.convert gguf-to-hf`: bad input is one `error:` line, exit 2, nothing written; the real
packaged GGUF converts into a plain HF checkpoint whose logits equal transformers' own GGUF load."""

from __future__ import annotations

import json

import pytest
import torch

from hybridflow.convert import main

gguf = pytest.importorskip("gguf", reason="needs the [real] extra (pip install -e .[real])")


def _exit_line(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert exc.value.code == 2 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def _gguf_of_architecture(path, arch: str) -> None:
    """A metadata-only GGUF file claiming `arch` (enough for the architecture check)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    err = _exit_line(["gguf-to-hf", "--gguf", str(tmp_path / "missing.gguf"), "--out", str(out)], capsys)
    assert err.startswith("error: --gguf:") and "does not exist" in err
    _gguf_of_architecture(tmp_path / "gpt2.gguf", "gpt2")
    err = _exit_line(["gguf-to-hf", "--gguf", str(tmp_path / "gpt2.gguf"), "--out", str(out)], capsys)
    assert "'gpt2'" in err and "llama" in err and "qwen2" in err
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all" * 10)
    err = _exit_line(["gguf-to-hf", "--gguf", str(tmp_path / "junk.gguf"), "--out", str(out)], capsys)
    assert err.startswith("error: --gguf:") and "not a readable GGUF" in err
    _gguf_of_architecture(tmp_path / "llama.gguf", "llama")
    out.mkdir()
    (out / "keep.txt").write_text("x")
    err = _exit_line(["gguf-to-hf", "--gguf", str(tmp_path / "llama.gguf"), "--out", str(out)], capsys)
    assert err.startswith("error: --out:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2.gguf", "junk.gguf", "llama.gguf", "out"]
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_gguf_without_weights_is_refused_and_leaves_nothing(tmp_path, capsys):
    # Passes the architecture check; transformers would load it with every weight randomly initialised.
    _gguf_of_architecture(tmp_path / "empty.gguf", "llama")
    err = _exit_line(["gguf-to-hf", "--gguf", str(tmp_path / "empty.gguf"), "--out", str(tmp_path / "out")], capsys)
    assert err.startswith("error: --gguf: empty.gguf lacks") and "weights" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.gguf"]  # no out, no .out.partial-*


@pytest.mark.slow
def test_real_gguf_converts_to_a_plain_hf_checkpoint(tmp_path, capsys):
    import transformers

    from hybridflow.convert.packaged_model import PACKAGED_MODELS

    pytest.importorskip("accelerate")
    record = PACKAGED_MODELS["smollm2_135m"]
    try:
        import importlib.metadata as md

        source = md.distribution(record.distribution).locate_file(record.file)
    except md.PackageNotFoundError:
        pytest.skip(f"needs {record.distribution}: {record.install}")
    out = tmp_path / "hf"
    assert main(["gguf-to-hf", "--gguf", str(source), "--out", str(out)]) == 0
    assert "converted" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] and config["num_key_value_heads"] == 3
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.chat_template and tok.eos_token_id == 2
    # Independent reference: transformers' own GGUF load of the same file.
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32).eval()
    converted = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = tok("What is 12 + 7?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, reference(ids).logits)


def test_gguf_architecture_comes_from_the_family_records(tmp_path):
    from hybridflow.convert.gguf import gguf_architecture

    for arch, want in {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}.items():
        _gguf_of_architecture(tmp_path / f"{arch}.gguf", arch)
        assert gguf_architecture(tmp_path / f"{arch}.gguf") == want
    _gguf_of_architecture(tmp_path / "qwen3moe.gguf", "qwen3moe")  # transformers reads it; no family builds it
    with pytest.raises(ValueError, match="^--gguf: architecture 'qwen3moe' .* use a GGUF of llama or qwen2 or qwen3"):
        gguf_architecture(tmp_path / "qwen3moe.gguf")
