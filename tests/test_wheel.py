"""A non-editable install works outside the repository: it carries the Hydra tree, and benchmarks stay out."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What setup.py builds from; tests/, scripts/ and docs/ are not part of the package.
SOURCES = ["setup.py", "pyproject.toml", "hybridflow", "megatron_adapters", "conf", "benchmarks"]


def test_installed_package_composes_a_config_from_another_directory(tmp_path):
    # Build from a copy so setuptools' build/ and egg-info never land in the checkout.
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    target = tmp_path / "site"
    # --no-deps/--no-index/--no-build-isolation: torch and setuptools come from this interpreter, nothing downloads.
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation",
         "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    assert (target / "hybridflow" / "conf" / "config.yaml").is_file()
    assert not (target / "benchmarks").exists(), "benchmarks/ must not install as a top-level package"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDFLOW_CONF_DIR"}
    env["PYTHONPATH"] = str(target)  # ahead of any editable install of the checkout
    proc = subprocess.run(
        [sys.executable, "-c", "import hybridflow.config as c; print(c.conf_dir())"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert Path(proc.stdout.strip()) == target / "hybridflow" / "conf"

    proc = subprocess.run([sys.executable, "-m", "hybridflow.plan", "+experiment=tiny_cpu"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((elsewhere / "plan.json").read_text())["experiment"] == "tiny_cpu"
