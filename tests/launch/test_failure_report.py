"""Which rank the launch error names when several are reported: its own failure beats peer errors and
the agent's SIGTERMs."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from hybridflow.launch.failure_report import describe_failure, keep_traceback_in_log, last_exception, root_cause


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
    assert message == (f"rank 2 (pid 1002) exited with code 1 (its last output: 'ValueError: bad batch'); "
                       f"log: {log2}; ranks [0] failed after it; the remaining ranks were stopped")


def test_only_peer_errors_says_so(tmp_path):
    failures = {1: _failure(tmp_path, 1, 1, "DistBackendError: NCCL communicator was aborted")}
    message = describe_failure(ChildFailedError("w", failures), {})
    assert "rank 1 (pid 1001) raised DistBackendError" in message and "failed because a peer went away" in message


def test_signal_death_is_named(tmp_path):
    failures = {3: _failure(tmp_path, 3, -signal.SIGKILL), 0: _failure(tmp_path, 0, -signal.SIGTERM)}
    message = describe_failure(ChildFailedError("w", failures), {})
    assert message.startswith("rank 3 (pid 1003) was killed by SIGKILL") and "ranks [0] were stopped" in message


REWARD_TRACEBACK = """Traceback (most recent call last):
  File "/work/hybridflow/trainer/scorer.py", line 44, in <lambda>
    return Scorer(lambda batch: compute_scores(fn, rule_inputs(tokenizer, batch)))
                                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/tmp/my_reward.py", line 2, in reward
    raise ValueError("boom")
ValueError: boom
"""


def test_recorded_exception_is_named_in_one_line_with_its_frame(tmp_path):
    failure = _failure(tmp_path, 1, 1, "ValueError: boom")
    data = json.loads(Path(failure.error_file).read_text())
    data["message"]["extraInfo"]["py_callstack"] = REWARD_TRACEBACK
    Path(failure.error_file).write_text(json.dumps(data))
    failure = ProcessFailure(local_rank=1, pid=1001, exitcode=1, error_file=failure.error_file)
    log = tmp_path / "r1.log"
    log.write_text("rl steps:   0%|\n")
    failures = {1: failure, 0: _failure(tmp_path, 0, -signal.SIGTERM)}
    message = describe_failure(ChildFailedError("w", failures), {1: str(log)})
    assert "\n" not in message
    assert message == (f"rank 1 (pid 1001) raised ValueError: boom at /tmp/my_reward.py:2 in reward; traceback in "
                       f"{log}; ranks [0] were stopped")
    keep_traceback_in_log(ChildFailedError("w", failures), {1: str(log)})
    keep_traceback_in_log(ChildFailedError("w", failures), {1: str(log)})  # once only
    assert log.read_text().count('raise ValueError("boom")') == 1


def test_traceback_in_the_log_is_read_when_no_error_file(tmp_path):
    log = tmp_path / "r0.log"
    log.write_text("starting\n" + REWARD_TRACEBACK.replace("ValueError: boom", "KeyError: 'answer'"))
    message = describe_failure(ChildFailedError("w", {0: _failure(tmp_path, 0, 1)}), {0: str(log)})
    assert message.startswith("rank 0 (pid 1000) raised KeyError: 'answer' at /tmp/my_reward.py:2 in reward;")


def test_last_exception_of_a_chain_and_of_no_traceback():
    chained = REWARD_TRACEBACK + "\nDuring handling of the above exception, another exception occurred:\n\n" + \
        REWARD_TRACEBACK.replace("ValueError: boom", "RuntimeError: again").replace("line 2,", "line 9,")
    assert last_exception(chained) == ("RuntimeError: again", "/tmp/my_reward.py:9 in reward")
    assert last_exception("just output\n") is None
