"""Turn torch elastic's ChildFailedError into one message: which rank failed first, how, and its log.

When one rank dies its peers fail right after it (gloo: "Connection reset by peer"; NCCL: aborted or timed
out communicators) and the agent then SIGTERMs the rest; torch reports all of them, with timestamps that
cannot order them (whole seconds, taken when the agent noticed). The root cause is the failure that is
neither a peer error (read from the rank's error file or the end of its stderr log) nor the agent's SIGTERM.
Ranks started from a Python callable are reported one at a time by torch (the lowest local rank among those
already dead), so there the named rank can be a consequence; the message says so when it is.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

LOG_TAIL_LINES = 20
# Substrings of the errors a rank raises when a peer, not itself, went wrong.
PEER_ERROR_SIGNS = (
    "Connection reset by peer", "Connection closed by peer", "Broken pipe", "DistNetworkError",
    "DistBackendError", "NCCL communicator was aborted", "Watchdog caught collective operation timeout",
)


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


def describe_failure(err: ChildFailedError, stderr_of_rank: dict[int, str]) -> str:
    """The message a user reads when a launch fails; `stderr_of_rank` maps global rank -> its stderr log."""
    rank = root_cause(err.failures, stderr_of_rank)
    failure = err.failures[rank]
    how = (f"was killed by {failure.signal_name()}" if failure.exitcode < 0
           else f"exited with code {failure.exitcode}")
    log = stderr_of_rank.get(rank, "")
    msg = f"rank {rank} (pid {failure.pid}) {how}; log: {log or '<console>'}"
    if is_peer_error(failure, log):
        log_dir = os.path.dirname(os.path.dirname(log)) if log else "the run's log directory"
        msg += f"; it failed because a peer went away: check the other ranks' logs under {log_dir}"
    others = sorted(set(err.failures) - {rank})
    failed_after = [r for r in others if not _stopped_by_agent(err.failures[r])]
    stopped = [r for r in others if _stopped_by_agent(err.failures[r])]
    if failed_after:
        msg += f"; ranks {failed_after} failed after it"
    msg += f"; ranks {stopped} were stopped" if stopped else "; the remaining ranks were stopped"
    tail = _tail(log) if log else ""
    if tail:
        msg += f"\n--- last lines of {log} ---\n{tail}"
    error = recorded_error(failure)
    if error and error not in tail:  # ranks run from a callable leave their traceback only in the error file
        stack = failure.error_file_data.get("message", {})
        stack = stack.get("extraInfo", {}).get("py_callstack", "") if isinstance(stack, dict) else ""
        lines = (stack or error).strip().splitlines()[-LOG_TAIL_LINES:]
        msg += f"\n--- error recorded by rank {rank} ---\n" + "\n".join(lines)
    return msg


def first_error(err: ChildFailedError, stderr_of_rank: dict[int, str]) -> str:
    """The exception text (`Type: message`) recorded by the rank `describe_failure` names ("" if none)."""
    return recorded_error(err.failures[root_cause(err.failures, stderr_of_rank)])
