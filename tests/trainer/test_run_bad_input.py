"""`python -m hybridflow.run` refuses bad input with one line, exit code 2, and writes nothing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    return subprocess.run(
        [sys.executable, "-m", "hybridflow.run", f"trainer.output_dir={out}", *overrides],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


def _bad_jsonl(tmp_path: Path) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"question": "1+1="}) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("make_overrides", "field"),
    [
        (lambda tmp: ["model.path=/nonexistent/model"], "model.path"),
        (lambda tmp: [f"data.source={_bad_jsonl(tmp)}", "trainer.warmup_sft_steps=0"], "data.prompt_key"),
        (lambda tmp: ["reward.fn=no_such_module.rewards:score"], "reward.fn"),
        (lambda tmp: ["+experiment=ppo_llama_1b_h200"], "cluster.gpus_per_node"),
        (lambda tmp: ["roles.actor.max_tokens_per_micro_batch=10"], "roles.actor.max_tokens_per_micro_batch"),
    ],
    ids=["missing-model-path", "no-prompt-field", "reward-fn-import", "more-gpus-than-present",
         "token-budget-below-longest-sample"],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, make_overrides, field):
    result = _run(tmp_path, *make_overrides(tmp_path))
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
