"""Known third-party warnings, shown once as one line instead of a wall of repeats from every rank.

megatron-core, torch and transformers warn at import and at every model build (four ranks x several
roles print the same deprecation each step of the setup). Each entry below is one such message and what it
means for a hybridflow run; the first occurrence prints `note: <meaning>` on rank 0 (or the launching
process) and every later one, on any rank, is dropped from the console. The full text of each distinct
known message (message, category, source file:line, logger) goes once per rank to
`<trainer.output_dir>/logs/warnings_rank<R>.txt` (`warnings_launcher.txt` for the launching process), which
the note names. Warnings not listed pass through unchanged.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Noise:
    """A known message (a substring of it), the logger that emits it (None: `warnings.warn`), and its
    one-line meaning."""

    text: str
    meaning: str
    logger: str | None = None
    quote: bool = False  # a catch-all entry: add the message itself (cut short) to say which one


KNOWN_NOISE = (
    Noise("GPTModel IS DEPRECATED", "megatron-core marks GPTModel deprecated (0.19 still ships it; hybridflow "
          "builds on it)", "megatron.core.models.gpt.gpt_model"),
    Noise("full_param_layout not provided", "megatron-core DDP computes its parameter layout itself",
          "megatron.core.distributed.distributed_data_parallel"),
    Noise("No CUDA runtime is found", "no CUDA runtime: running on the CPU backend", "torch.utils.cpp_extension"),
    Noise("Apex is not installed", "Apex is not installed: torch norms and optimizers are used"),
    Noise("Transformer Engine and Apex are not installed", "Transformer Engine/Apex absent: megatron-core uses "
          "its local kernels"),
    Noise("MimoModelConfig is experimental", "megatron-core's experimental MIMO config imported (unused)"),
    Noise("If you are using transformer_engine as the transformer implementation",
          "megatron-core's note on recomputing Transformer Engine's fused attention"),
    Noise("CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_DEVICE_MAX_CONNECTIONS unset (matters only for TP comm overlap)"),
    Noise("non-leaf Tensor", "torch: .grad of a non-leaf tensor read (megatron-core internals)"),
    Noise("MCore's async save is deprecated", "megatron-core's own save path logs that its async mode is "
          "deprecated (checkpoints here are written synchronously)",
          "megatron.core.dist_checkpointing.strategies.torch"),
    # Resuming: megatron-core's dist_checkpointing.load through torch's distributed-checkpoint reader
    Noise("torch.distributed is disabled, unavailable or uninitialized", "torch's checkpoint reader loads "
          "megatron-core's per-rank common state without a process group (resuming)"),
    Noise("The argument order of load has been changed", "torch's checkpoint reader notes a changed argument "
          "order in megatron-core's load call (resuming)"),
    Noise("deprecating ShardedTensor", "torch deprecates ShardedTensor, which megatron-core's checkpoint loader "
          "still builds (resuming)"),
    Noise("is deprecated", "deprecated in a dependency", quote=True),
)

_seen: set[str] = set()  # noise entries already noted on the console
_written: set[str] = set()  # full messages already in `_full_text_file` (reset when the file changes)
_show = True
_full_text_file: Path | None = None


def _known(message: str) -> Noise | None:
    return next((n for n in KNOWN_NOISE if n.text in message), None)


def warnings_file(log_dir: str | os.PathLike[str], rank: str | None) -> Path:
    """Where a rank (None: the launching process) keeps the full text of its known warnings."""
    return Path(log_dir) / (f"warnings_rank{rank}.txt" if rank is not None else "warnings_launcher.txt")


def _write_full_text(message: str, source: str) -> None:
    if _full_text_file is None or message in _written:
        return
    _written.add(message)
    _full_text_file.parent.mkdir(parents=True, exist_ok=True)
    with _full_text_file.open("a") as out:
        out.write(f"--- {source}\n{message.rstrip()}\n")


def _note(noise: Noise, message: str, source: str) -> bool:
    """Log the full text, print `noise` the first time (where shown); True when the message was a known one."""
    _write_full_text(message, source)
    if noise.text not in _seen:
        _seen.add(noise.text)
        if _show:
            said = noise.meaning + (f": {message.splitlines()[0][:100]}" if noise.quote else "")
            where = f"; full text in {_full_text_file}" if _full_text_file is not None else ""
            print(f"note: {said} (known warning, shown once{where})", file=sys.stderr, flush=True)
    return True


class _LogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        noise = _known(record.getMessage())
        source = f"logger {record.name} ({record.levelname}) at {record.pathname}:{record.lineno}"
        return noise is None or not _note(noise, record.getMessage(), source)


def quiet_known_noise(show: bool | None = None, log_dir: str | os.PathLike[str] | None = None) -> None:
    """Route the known warnings through `_note` in this process (idempotent; a later call updates `show`
    and `log_dir`). `show` defaults to "this is rank 0 or not a rank": other ranks drop them silently, rank 0
    says each once. With `log_dir`, each distinct known message's full text goes once to this process's
    `warnings_file` there (a forked rank starts its own file, even for messages its parent already saw)."""
    global _show, _full_text_file
    _show = show if show is not None else os.environ.get("RANK", "0") == "0"
    if log_dir is not None:
        path = warnings_file(log_dir, os.environ.get("RANK")).resolve()
        if path != _full_text_file:
            _full_text_file = path
            _written.clear()
    original = warnings.showwarning
    if getattr(original, "_hybridflow", False):
        return

    def showwarning(message, category, filename, lineno, file=None, line=None):
        noise = _known(str(message))
        if noise is None:
            original(message, category, filename, lineno, file, line)
        else:
            _note(noise, str(message), f"warnings.warn {category.__name__} at {filename}:{lineno}")

    showwarning._hybridflow = True  # type: ignore[attr-defined]
    warnings.showwarning = showwarning
    # "always": the default filter shows a warning once per call site, so the same text from ten sites
    # would reach us ten times anyway; here it is counted once by text.
    for noise in KNOWN_NOISE:
        if noise.logger is None:
            warnings.filterwarnings("always", message=f".*{noise.text}.*")
    log_filter = _LogFilter()
    for name in {n.logger for n in KNOWN_NOISE if n.logger}:
        logging.getLogger(name).addFilter(log_filter)
