"""The sandboxed code runner stops code that opens a socket, fork-bombs, writes outside its directory or loops
forever; each is reported as an observation and leaves no process and no scratch directory behind. Run with the
isolation this machine gives (as root: network and PID namespaces, uid 65534) and with the audit-hook fallback."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hybridflow.tools import get_tool
from hybridflow.tools.invocation import run_turn_calls
from hybridflow.tools.sandbox import SandboxLimits, run_python
from hybridflow.tools.sandbox_isolation import Isolation, probe_isolation

QUICK = SandboxLimits(wall_s=4, cpu_s=3, max_processes=8)
HOOK_ONLY = Isolation(prefix=(), uid=None, network="audit hook", processes="audit hook refusing forks",
                      block_sockets=True, block_forks=True)
ISOLATIONS = [pytest.param(None, id="probed"), pytest.param(HOOK_ONLY, id="audit-hook")]


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line holds `text` (every process of a run carries its scratch path)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def _run(code: str, isolation: Isolation | None, limits: SandboxLimits = QUICK):
    result = run_python(code, limits, isolation)
    assert not Path(result.scratch).exists(), "scratch directory left behind"
    assert _processes_mentioning(result.scratch) == [], "process left behind"
    return result


def test_probed_isolation_on_this_machine_is_namespaces_as_root():
    isolation = probe_isolation()
    if os.geteuid() == 0 and isolation.network != "network namespace":
        pytest.skip(f"unshare is not usable here ({isolation.describe()})")
    assert isolation.network == "network namespace" and not isolation.block_sockets
    assert "RLIMIT_NPROC" in isolation.processes


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_program_runs_and_writes_inside_its_scratch_directory(isolation):
    result = _run("open('note.txt', 'w').write('kept here')\nimport os\nprint(open('note.txt').read(), os.getcwd())",
                  isolation)
    assert result.exit_code == 0 and result.stopped_by is None
    assert result.stdout == f"kept here {result.scratch}\n"
    assert result.observation() == f"exit code 0\nstdout:\nkept here {result.scratch}\n"


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_socket_is_stopped(isolation):
    result = _run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\nprint('connected')", isolation)
    assert result.exit_code == 1 and "connected" not in result.stdout
    expected = "Network is unreachable" if (isolation or probe_isolation()).network == "network namespace" else \
        "PermissionError: sandbox: network access is refused (socket."
    assert expected in result.stderr and expected in result.observation()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_writes_outside_scratch_and_other_programs_are_refused(isolation, tmp_path):
    outside = tmp_path / "escaped.txt"
    for code, refusal in ((f"open({str(outside)!r}, 'w').write('x')", "writing outside the scratch directory"),
                          ("open('../escaped.txt', 'a')", "writing outside the scratch directory"),
                          (f"import os\nos.remove({str(outside)!r})", "os.remove outside the scratch directory"),
                          (f"import os\nos.system('touch {outside}')", "starting other programs is refused")):
        result = _run(code, isolation)
        assert result.exit_code == 1 and f"PermissionError: sandbox: {refusal}" in result.stderr, code
        assert "main.py" in result.stderr and "runpy" not in result.stderr and "<string>" not in result.stderr
    assert not outside.exists()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_reads_outside_scratch_are_refused_and_imports_still_work(isolation, tmp_path):
    """Before: only writes were guarded, and as root the child kept CAP_DAC_READ_SEARCH, so model code read any file
    of the machine (/etc/shadow, checkpoints, the dataset's answers)."""
    secret = tmp_path / "answers.txt"
    secret.write_text("42")
    for code, refusal in ((f"print(open({str(secret)!r}).read())", "reading outside the scratch directory"),
                          ("print(open('/etc/shadow').read())", "reading outside the scratch directory"),
                          ("import os\nprint(os.listdir('/root'))", "listing outside the scratch directory")):
        result = _run(code, isolation)
        assert result.exit_code == 1 and f"PermissionError: sandbox: {refusal}" in result.stderr, (code, result)
        assert "42" not in result.stdout
    result = _run("import json, fractions, decimal, statistics\nprint(json.dumps(float(fractions.Fraction(1, 4))))",
                  isolation)
    assert result.exit_code == 0 and result.stdout == "0.25\n", result


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_endless_loop_is_killed_at_the_wall_clock(isolation):
    start = time.monotonic()
    result = _run("while True:\n    pass", isolation, SandboxLimits(wall_s=2, cpu_s=60))
    assert time.monotonic() - start < 10
    assert result.exit_code is None and result.stopped_by.startswith("wall-clock limit of 2 s")
    assert result.observation().startswith("stopped: wall-clock limit of 2 s")


def test_cpu_limit_stops_a_busy_loop():
    result = _run("while True:\n    pass", None, SandboxLimits(wall_s=30, cpu_s=1))
    assert result.stopped_by == "CPU time limit of 1 s"


def test_process_limit_bounds_forks():
    isolation = probe_isolation()
    if isolation.block_forks:
        pytest.skip(f"forks are refused outright here ({isolation.describe()})")
    code = ("import os, time\nn = 0\nwhile True:\n    try:\n        pid = os.fork()\n"
            "    except OSError as err:\n        print(n, err.errno)\n        break\n"
            "    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n    n += 1\n")
    result = _run(code, isolation, SandboxLimits(wall_s=10, max_processes=8))
    forks, errno = map(int, result.stdout.split())
    assert errno == 11 and 0 < forks <= 8  # EAGAIN from RLIMIT_NPROC, within the allowance
    assert result.exit_code == 0  # the sleeping children were killed with the run


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_fork_bomb_is_stopped(isolation):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = _run(bomb, isolation, SandboxLimits(wall_s=3, cpu_s=2, max_processes=8))
    # Stopped by the CPU or the wall-clock limit, whichever comes first on a busy machine; no process is left.
    assert result.stopped_by is not None
    if isolation is HOOK_ONLY:  # there the bomb's forks were refused, each one (it catches the error)
        refused = _run("import os\nos.fork()", isolation)
        assert "PermissionError: sandbox: os.fork is refused" in refused.stderr


def test_python_tool_answers_with_the_observation_and_never_raises():
    results = run_turn_calls('<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
                             '<tool_call>{"name": "python", "arguments": {"program": "1"}}</tool_call>',
                             {"python": get_tool("python")})
    assert [o.content for o in results.outcomes] == [
        "exit code 0\nstdout:\n42\n", 'error: tool python raised ValueError: call it with {"code": "<python program>"}']
    assert results.metrics == {"tool_calls": 2, "tool_errors/exception": 1}


def test_syntax_error_is_reported():
    result = _run("print(", None)
    assert result.exit_code == 1 and "SyntaxError" in result.stderr and "main.py" in result.stderr


def test_file_size_limit_is_an_error_the_code_sees():
    result = _run("try:\n    with open('big', 'wb') as f:\n        f.write(b'x' * 4096)\nexcept OSError as err:\n"
                  "    print(err.errno)",
                  None, SandboxLimits(file_bytes=1024))
    assert result.exit_code == 0 and result.stdout == "27\n"  # EFBIG, not a SIGXFSZ death


def test_children_left_running_are_killed_with_the_run_without_namespaces():
    # No PID namespace to take them down: the runner's kill of the run's session must find them, including one
    # that moved to a process group of its own.
    no_namespaces = Isolation(prefix=(), uid=None, network="audit hook", processes="RLIMIT_NPROC",
                              block_sockets=True, block_forks=False)
    code = ("import os, time\nfor i in range(3):\n    if os.fork() == 0:\n        if i == 0:\n"
            "            os.setpgid(0, 0)\n        time.sleep(60)\n        os._exit(0)\nprint('parent done')\n")
    result = _run(code, no_namespaces)
    assert result.exit_code == 0 and result.stdout == "parent done\n"
