"""Running untrusted Python (model-written code) in a child process under limits, and the `python` tool.

Each run gets a fresh scratch directory as its cwd (removed after), its own session, CPU-seconds, address-space,
file-size and process-count limits, a wall-clock timeout that kills everything the run started, no network
(hybridflow.tools.sandbox_isolation says how, per machine) and an audit hook refusing writes outside the
scratch directory and the start of other programs (hybridflow.tools.sandbox_guard). This guards against honest
mistakes and model output; it is not a hardened jail against a kernel exploit or ctypes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hybridflow.tools.record import ToolRecord
from hybridflow.tools.sandbox_isolation import Isolation, probe_isolation
from hybridflow.tools.truncation import truncate_middle
from hybridflow.units import GIB

_GUARD = (Path(__file__).with_name("sandbox_guard.py")).read_text()
SCRATCH_PREFIX = "hybridflow-sandbox-"
EXIT_CPU_LIMIT = 128 + signal.SIGXCPU  # what sandbox_guard exits with at the CPU limit


@dataclass(frozen=True)
class SandboxLimits:
    """Bounds of one run. Memory is address space (Python itself needs ~100 MiB of it)."""

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_bytes: int = GIB
    file_bytes: int = 16 << 20
    max_processes: int = 16
    max_output_chars: int = 4000  # per stream, truncated in the middle


@dataclass(frozen=True)
class SandboxResult:
    """How a run ended (`exit_code`, or `stopped_by` naming the limit), its output, and where it ran."""

    exit_code: int | None
    stopped_by: str | None
    stdout: str
    stderr: str
    scratch: str  # removed by the time the result is returned
    isolation: str

    def observation(self) -> str:
        """The text the model reads."""
        status = f"stopped: {self.stopped_by}" if self.stopped_by else f"exit code {self.exit_code}"
        parts = [status]
        parts += [f"{name}:\n{text}" for name, text in (("stdout", self.stdout), ("stderr", self.stderr)) if text]
        return "\n".join(parts)


def _session_members(sid: int) -> list[int]:
    """Live processes of session `sid` (the run's own session, whatever process groups it made inside)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
        if int(fields[3]) == sid and fields[0] != "Z":  # field 6 of stat: session; zombies are already dead
            members.append(int(entry))
    return members


def _end_session(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Kill every process of the run's session and reap the child; its namespaces die with it."""
    for _ in range(int(grace_s / 0.05)):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in _session_members(proc.pid):  # any that moved to a process group of their own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is not None and not _session_members(proc.pid):
            return
        time.sleep(0.05)


def _stopped_by(code: int, timed_out: bool, limits: SandboxLimits) -> str | None:
    if timed_out:
        return f"wall-clock limit of {limits.wall_s:g} s (every process of the run was killed)"
    if code in (EXIT_CPU_LIMIT, -signal.SIGXCPU):
        return f"CPU time limit of {limits.cpu_s} s"
    return f"signal {signal.Signals(-code).name}" if code < 0 else None


def _read(stream, limit: int) -> str:
    stream.seek(0)
    return truncate_middle(stream.read(4 * limit + 4).decode("utf-8", "replace"), limit)


def _command(isolation: Isolation, scratch: str, limits: SandboxLimits) -> list[str]:
    flags = [str(int(isolation.block_sockets)), str(int(isolation.block_forks))]
    return [*isolation.prefix, sys.executable, "-I", "-B", "-X", "utf8", "-c", _GUARD, scratch, str(limits.cpu_s),
            str(limits.memory_bytes), str(limits.file_bytes), str(limits.max_processes), *flags]


def run_python(code: str, limits: SandboxLimits | None = None, isolation: Isolation | None = None) -> SandboxResult:
    """Run `code` as `main.py` in a fresh scratch directory under `limits`; always returns (no raise for
    anything the code does) and leaves no process or directory behind."""
    limits = limits or SandboxLimits()
    isolation = isolation or probe_isolation()
    scratch = os.path.realpath(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    try:
        main = Path(scratch, "main.py")
        main.write_text(code)
        if isolation.uid is not None:  # the dropped user owns its scratch and nothing else
            for path in (scratch, main):
                os.chown(path, isolation.uid, isolation.uid)
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(_command(isolation, scratch, limits), cwd=scratch, env=env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
            try:
                proc.wait(limits.wall_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _end_session(proc)
            stdout, stderr = _read(out, limits.max_output_chars), _read(err, limits.max_output_chars)
        code_ = proc.returncode
        return SandboxResult(None if timed_out else code_, _stopped_by(code_, timed_out, limits), stdout, stderr,
                             scratch, isolation.describe())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_code_tool(arguments: dict) -> str:
    code = arguments.get("code")
    if not isinstance(code, str):
        raise ValueError('call it with {"code": "<python program>"}')
    return run_python(code).observation()


PYTHON = ToolRecord(
    name="python",
    description="Run a Python program (no network, no files outside its directory, 10 s) and return its output.",
    parameters={"type": "object", "properties": {"code": {"type": "string", "description": "the program"}},
                "required": ["code"]},
    call=_run_code_tool,
    timeout_s=SandboxLimits().wall_s + 10.0,  # the sandbox kills at its own wall limit first
)
