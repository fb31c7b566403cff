"""Which rank the launch error names when several are reported: its own failure beats peer errors and
the agent's SIGTERMs."""

from __future__ import annotations

import json
import signal

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from hybridflow.launch.failure_report import describe_failure, root_cause


def _failure(tmp_path, rank: int, exitcode: int, message: str | None = None) -> ProcessFailure:
    error_file = tmp_path / f"error{rank}.json"
    if message is not None:  # what torch's @record writes for an uncaught exception
        error_file.write_text(json.dumps({"message": {"message": message, "extraInfo": {
            "py_callstack": "", "timestamp": "100"}}}))
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(error_file))


def test_own_failure_beats_peer_errors_and_sigterm(tmp_path):
    failures = {
        0: _failure(tmp_path, 0, 1, "RuntimeError: [gloo] Connection reset by peer"),
        1: _failure(tmp_path, 1, -signal.SIGTERM),
        2: _failure(tmp_path, 2, 1),  # exited on its own, no traceback recorded
    }
    assert root_cause(failures, {}) == 2


def test_peer_error_read_from_the_log_when_no_error_file(tmp_path):
    log0 = tmp_path / "r0.log"
    log0.write_text("Traceback ...\nRuntimeError: Connection closed by peer [127.0.0.1]:1234\n")
    log2 = tmp_path / "r2.log"
    log2.write_text("ValueError: bad batch\n")
    failures = {0: _failure(tmp_path, 0, 1), 2: _failure(tmp_path, 2, 1)}
    assert root_cause(failures, {0: str(log0), 2: str(log2)}) == 2
    message = describe_failure(ChildFailedError("w", failures), {0: str(log0), 2: str(log2)})
    assert message.startswith(f"rank 2 (pid 1002) exited with code 1; log: {log2}; ranks [0] failed after it")
    assert message.endswith("ValueError: bad batch")


def test_only_peer_errors_says_so(tmp_path):
    failures = {1: _failure(tmp_path, 1, 1, "DistBackendError: NCCL communicator was aborted")}
    message = describe_failure(ChildFailedError("w", failures), {})
    assert "rank 1 (pid 1001) exited with code 1" in message and "failed because a peer went away" in message


def test_signal_death_is_named(tmp_path):
    failures = {3: _failure(tmp_path, 3, -signal.SIGKILL), 0: _failure(tmp_path, 0, -signal.SIGTERM)}
    message = describe_failure(ChildFailedError("w", failures), {})
    assert message.startswith("rank 3 (pid 1003) was killed by SIGKILL") and "ranks [0] were stopped" in message
