"""Ranks, and the processes ranks start, end when the process that launched them dies.

Without this, `kill -9` of `python -m hybridflow.run` left every rank training on (holding its GPU), writing
`final_hf` and then hanging. Two mechanisms, because neither reaches every process:

- The parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`): the kernel sends SIGKILL when the *thread*
  that forked this process exits. It covers a child whose parent is the process to follow: a rank the agent
  spawned (CUDA) or started as a subprocess (a module or script entrypoint), and an engine process started by
  its rank. Every such fork happens on the parent's main thread (the elastic agent runs on the launcher's
  main thread; ranks start engines from theirs), so the signal does not fire early while the parent lives.
- A watchdog thread waiting on a pidfd of the launcher (readable once that process has exited, whoever its
  parent was). It covers a rank forked by the fork server (CPU): that rank's parent is the fork server, an
  intermediate process, so its parent-death signal follows the fork server, not the launcher. When the
  launcher is gone the watchdog kills this process's children and then the process itself.

A third covers what a rank forks itself (dist_checkpointing's results Manager, one per rank, forked on the
first checkpoint): such a child has neither, and held the fork server's and the resource tracker's pipes, so
after a killed rank or Ctrl-C it kept both alive forever. Every child a rank forks watches the rank (a pidfd,
as above: it does not depend on which thread forked it) through an `os.register_at_fork` hook, which its own
forks inherit.

The launcher's pid travels as an argument of a callable entrypoint (a forked rank sees only the variables the
agent sets) and as HYBRIDFLOW_LAUNCHER_PID for a subprocess entrypoint, whose `init_distributed` reads it.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import psutil

LAUNCHER_PID_VARIABLE = "HYBRIDFLOW_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_watched: set[tuple[int, int]] = set()  # (this process, the pid it follows): a fork inherits no thread


def die_with_parent() -> None:
    """Ask the kernel for SIGKILL when the thread that started this process exits (Linux; else no-op)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent == 1 or not psutil.pid_exists(parent):  # it died before the request: nothing will signal us
        os.kill(os.getpid(), signal.SIGKILL)


def _is_ancestor(pid: int) -> bool:
    """Whether `pid` is this process's parent, grandparent, ...: the pid we were given is still that process."""
    try:
        return any(p.pid == pid for p in psutil.Process().parents())
    except psutil.NoSuchProcess:
        return False


def _end_this_process_tree() -> None:
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def watch(pid: int) -> None:
    """Kill this process and its children as soon as its ancestor `pid` exits (idempotent per pid)."""
    if (os.getpid(), pid) in _watched or not hasattr(os, "pidfd_open"):
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        fd = None
    # Checked after opening: while the ancestor lives its pid cannot be reused, so the pidfd is the right one.
    if fd is None or not _is_ancestor(pid):
        _end_this_process_tree()
    _watched.add((os.getpid(), pid))

    def wait_for_exit() -> None:
        select.select([fd], [], [])
        _end_this_process_tree()

    threading.Thread(target=wait_for_exit, name=f"watch-pid-{pid}", daemon=True).start()


def _stop_quietly(signum: int, frame: Any) -> None:
    """Ctrl-C reaches every rank of the terminal's process group; the launcher alone reports it (one line)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)  # children end through their own parent-death signal


def _follow_forking_parent() -> None:
    """Run in every child a rank (or one of its forks) forks: end when that parent ends."""
    watch(os.getppid())


_fork_hook_in: set[int] = set()  # processes that registered the hook (a fork inherits it, and this set)


def stay_with_launcher() -> None:
    """In a rank: end with the launcher named by HYBRIDFLOW_LAUNCHER_PID, have every process it forks end with
    it, and end quietly on Ctrl-C (nothing outside a local launch)."""
    pid = os.environ.get(LAUNCHER_PID_VARIABLE)
    if not pid:
        return
    if int(pid) == os.getppid():
        die_with_parent()
    watch(int(pid))
    if not _fork_hook_in:
        os.register_at_fork(after_in_child=_follow_forking_parent)
    _fork_hook_in.add(os.getpid())
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _stop_quietly)


def run_with_launcher(launcher_pid: int, fn: Callable[..., Any], *args: Any) -> Any:
    """A callable rank's entrypoint: follow the launcher first, then run `fn(*args)`."""
    os.environ[LAUNCHER_PID_VARIABLE] = str(launcher_pid)
    stay_with_launcher()
    return fn(*args)
