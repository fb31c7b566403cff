"""Turn torch elastic's ChildFailedError into one line: which rank failed first, what it raised and where.

When one rank dies its peers fail right after it (gloo: "Connection reset by peer"; NCCL: aborted or timed
out communicators) and the agent then SIGTERMs the rest; torch reports all of them, with timestamps that
cannot order them (whole seconds, taken when the agent noticed). The root cause is the failure that is
neither a peer error (read from the rank's error file or the end of its stderr log) nor the agent's SIGTERM.
Ranks started from a Python callable are reported one at a time by torch (the lowest local rank among those
already dead), so there the named rank can be a consequence; the line says so when it is.

The line names the exception (`Type: message`) and the innermost frame (`file:line in function`) when the
rank raised one, else how it ended and its last line of output; the full traceback is in the rank's stderr log
(`keep_traceback_in_log` copies it there for ranks run from a callable, whose traceback torch writes only to
its error file).
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

LOG_TAIL_LINES = 20
# Substrings of the errors a rank raises when a peer, not itself, went wrong.
PEER_ERROR_SIGNS = (
    "Connection reset by peer", "Connection closed by peer", "Broken pipe", "DistNetworkError",
    "DistBackendError", "NCCL communicator was aborted", "Watchdog caught collective operation timeout",
)
TRACEBACK_START = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
LOG_HEADER = "--- uncaught exception (torch recorded it in {error_file}) ---"


def _tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _stopped_by_agent(failure: ProcessFailure) -> bool:
    return failure.exitcode == -signal.SIGTERM


def recorded_error(failure: ProcessFailure) -> str:
    """The exception text torch's @record wrote for the rank ("" when it wrote none)."""
    if not os.path.isfile(failure.error_file):
        return ""
    message = failure.message  # a str, or {"message": str, "extraInfo": {...}} from @record
    return str(message.get("message", "")) if isinstance(message, dict) else str(message)


def recorded_traceback(failure: ProcessFailure) -> str:
    """The traceback torch's @record wrote for the rank ("" when it wrote none)."""
    if not os.path.isfile(failure.error_file):
        return ""
    data = failure.error_file_data.get("message", {})
    return str(data.get("extraInfo", {}).get("py_callstack", "")) if isinstance(data, dict) else ""


def last_exception(text: str) -> tuple[str, str] | None:
    """(`Type: message` first line, `file:line in function` of the innermost frame or "") of the last Python
    traceback in `text`; None when it holds none."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == TRACEBACK_START]
    if not starts:
        return None
    block = lines[starts[-1] + 1:]
    where, last_frame = "", -1
    for i, line in enumerate(block):
        frame = _FRAME.match(line)
        if frame:
            where, last_frame = f"{frame[1]}:{frame[2]} in {frame[3]}", i
    # The exception text: the first unindented, non-empty line after the innermost frame's source lines.
    error = next((line.strip() for line in block[last_frame + 1:] if line.strip() and not line[0].isspace()), "")
    return (error, where) if error else None


def _exception_of(failure: ProcessFailure, log: str) -> tuple[str, str] | None:
    """What the rank raised: its error file first (ranks run from a callable), else its stderr log."""
    recorded = recorded_error(failure)
    if recorded:
        found = last_exception(recorded_traceback(failure))
        return recorded.strip().splitlines()[0], found[1] if found else ""
    return last_exception(_tail(log, 400)) if log else None


def is_peer_error(failure: ProcessFailure, log: str = "") -> bool:
    """True when the rank ended on a communication error caused by another rank."""
    if failure.exitcode < 0:
        return False
    text = recorded_error(failure) + (_tail(log) if log else "")
    return any(sign in text for sign in PEER_ERROR_SIGNS)


def root_cause(failures: dict[int, ProcessFailure], stderr_of_rank: dict[int, str]) -> int:
    """The global rank most likely to have failed first: own errors, then peer errors, then SIGTERMed."""
    def order(rank: int) -> tuple[int, float, int]:
        failure = failures[rank]
        tier = 2 if _stopped_by_agent(failure) else int(is_peer_error(failure, stderr_of_rank.get(rank, "")))
        return tier, failure.timestamp, rank

    return min(failures, key=order)


def _last_output_line(log: str) -> str:
    lines = [line.strip() for line in _tail(log).splitlines() if line.strip()]
    return lines[-1][-200:] if lines else ""


def describe_failure(err: ChildFailedError, stderr_of_rank: dict[int, str]) -> str:
    """The one line a user reads when a launch fails; `stderr_of_rank` maps global rank -> its stderr log."""
    rank = root_cause(err.failures, stderr_of_rank)
    failure = err.failures[rank]
    log = stderr_of_rank.get(rank, "")
    raised = _exception_of(failure, log) if failure.exitcode > 0 else None
    if raised is not None:
        error, where = raised
        msg = f"rank {rank} (pid {failure.pid}) raised {error}" + (f" at {where}" if where else "")
        msg += f"; traceback in {log or 'its error file ' + failure.error_file}"
    else:
        how = (f"was killed by {failure.signal_name()}" if failure.exitcode < 0
               else f"exited with code {failure.exitcode}")
        last = _last_output_line(log) if log else ""
        msg = f"rank {rank} (pid {failure.pid}) {how}" + (f" (its last output: {last!r})" if last else "")
        msg += f"; log: {log or '<console>'}"
    if is_peer_error(failure, log):
        log_dir = os.path.dirname(os.path.dirname(log)) if log else "the run's log directory"
        msg += f"; it failed because a peer went away: check the other ranks' logs under {log_dir}"
    others = sorted(set(err.failures) - {rank})
    failed_after = [r for r in others if not _stopped_by_agent(err.failures[r])]
    stopped = [r for r in others if _stopped_by_agent(err.failures[r])]
    if failed_after:
        msg += f"; ranks {failed_after} failed after it"
    return msg + (f"; ranks {stopped} were stopped" if stopped else "; the remaining ranks were stopped")


def keep_traceback_in_log(err: ChildFailedError, stderr_of_rank: dict[int, str]) -> None:
    """Append each failed rank's recorded traceback to its stderr log, where the one line points (a rank run
    from a callable leaves it only in torch's error file). Call once the ranks' output is no longer shown."""
    for rank, failure in err.failures.items():
        stack, log = recorded_traceback(failure), stderr_of_rank.get(rank, "")
        if not stack or not log or not os.path.isfile(log) or stack.strip() in _tail(log, 400):
            continue
        with open(log, "a") as f:
            f.write(f"\n{LOG_HEADER.format(error_file=failure.error_file)}\n{stack.rstrip()}\n")


def first_error(err: ChildFailedError, stderr_of_rank: dict[int, str]) -> str:
    """The exception text (`Type: message`) raised by the rank `describe_failure` names ("" if none)."""
    rank = root_cause(err.failures, stderr_of_rank)
    failure = err.failures[rank]
    raised = _exception_of(failure, stderr_of_rank.get(rank, ""))
    return recorded_error(failure) or (raised[0] if raised else "")
