"""The first code the sandboxed child runs (hybridflow.tools.sandbox passes this file's text to `python -I -c`,
so it imports nothing of hybridflow): set the resource limits, install an audit hook, then run the untrusted
`main.py` of the scratch directory as `__main__`.

The hook refuses, raising PermissionError inside the untrusted code: opening a file for writing (or creating,
removing, renaming one) outside the scratch directory; reading a file or listing a directory outside it and the
interpreter's own library (its import path when the hook goes in: as root with CAP_DAC_READ_SEARCH kept, file
permissions stop no read); starting other programs (whose writes and sockets no
Python hook would see); sockets, when `block_sockets` (no network namespace); forks, when `block_forks` (the
process limit cannot bind a root user). An audit hook is a guard against honest mistakes and model output, not
a jail: ctypes or a kernel exploit get past it. Limits are set here rather than in a `preexec_fn` because the
parent runs tools on threads, where CPython documents `preexec_fn` as unsafe.

argv: scratch_dir cpu_s memory_bytes file_bytes max_processes block_sockets block_forks (0/1 flags).
"""

import os
import resource
import runpy
import signal
import sys
import traceback

# The exit code after the CPU limit's SIGXCPU; the runner maps it back (a signal's death does not pass
# through `unshare` reliably). Kept equal to hybridflow.tools.sandbox.EXIT_CPU_LIMIT.
EXIT_CPU_LIMIT = 128 + signal.SIGXCPU


def _own_processes() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.listdir("/proc"):
        try:
            count += entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid
        except OSError:  # exited meanwhile
            pass
    return count


def _cpu_limit_reached(signum, frame) -> None:
    os.write(2, b"\nsandbox: CPU time limit reached\n")
    os._exit(EXIT_CPU_LIMIT)


def _set_limits(cpu_s: int, memory_bytes: int, file_bytes: int, max_processes: int) -> None:
    # SIGXCPU at the soft limit ends the run with EXIT_CPU_LIMIT; the hard limit one second later is the
    # kernel's SIGKILL for code that ignores it.
    signal.signal(signal.SIGXCPU, _cpu_limit_reached)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    # Over the file-size limit a write fails with EFBIG (an OSError the code sees) instead of SIGXFSZ.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # RLIMIT_NPROC counts every process of the real user, so the allowance is on top of those running now.
    nproc = _own_processes() + max_processes
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {"os.remove": 0, "os.rmdir": 0, "os.mkdir": 0, "os.rename": (0, 1), "os.truncate": 0,
                "os.symlink": (0, 1), "os.link": (0, 1), "os.chmod": 0, "os.chown": 0, "shutil.rmtree": 0,
                "os.utime": 0}
_PROGRAM_EVENTS = ("os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen", "pty.spawn")


_LIST_EVENTS = ("os.listdir", "os.scandir")


def _install_hook(scratch: str, block_sockets: bool, block_forks: bool) -> None:
    realpath, isinstance_, str_, bytes_, fsdecode = os.path.realpath, isinstance, str, bytes, os.fsdecode
    library = tuple({realpath(p) for p in (*sys.path, sys.prefix, sys.base_prefix, sys.exec_prefix)
                     if p and os.path.isdir(p)})

    def inside(path: object, roots: tuple[str, ...] = (scratch,)) -> bool:
        if isinstance_(path, int):  # an already open descriptor: its opening was checked
            return True
        if not isinstance_(path, (str_, bytes_)):
            return False
        resolved = realpath(fsdecode(path))
        return any(resolved == root or resolved.startswith(root + "/") for root in roots)

    readable = (scratch, *library)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writes = ((isinstance_(mode, str_) and any(c in mode for c in "wax+"))
                      or (isinstance_(flags, int) and flags & _WRITE_FLAGS))
            if writes and not inside(path):
                raise PermissionError(f"sandbox: writing outside the scratch directory is refused: {path!r}")
            if path is not None and not inside(path, readable):
                raise PermissionError(f"sandbox: reading outside the scratch directory is refused: {path!r}")
        elif event in _LIST_EVENTS and not inside(args[0] if args[0] is not None else ".", readable):
            raise PermissionError(f"sandbox: listing outside the scratch directory is refused: {args[0]!r}")
        elif event in _PATH_EVENTS:
            where = _PATH_EVENTS[event]
            for i in (where if isinstance_(where, tuple) else (where,)):
                if not inside(args[i]):
                    raise PermissionError(f"sandbox: {event} outside the scratch directory is refused: {args[i]!r}")
        elif event.startswith(_PROGRAM_EVENTS):
            raise PermissionError(f"sandbox: starting other programs is refused ({event})")
        elif block_sockets and event.startswith("socket."):
            raise PermissionError(f"sandbox: network access is refused ({event})")
        elif block_forks and event in ("os.fork", "os.forkpty"):
            raise PermissionError(f"sandbox: {event} is refused")

    sys.addaudithook(hook)


def main() -> None:
    scratch, cpu_s, memory, fsize, nproc, block_sockets, block_forks = sys.argv[1:8]
    scratch = os.path.realpath(scratch)
    _set_limits(int(cpu_s), int(memory), int(fsize), int(nproc))
    sys.dont_write_bytecode = True
    _install_hook(scratch, block_sockets == "1", block_forks == "1")
    sys.argv = [os.path.join(scratch, "main.py")]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit:
        raise
    except BaseException as err:  # the model reads this: only its own frames, not runpy's or this guard's
        frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == sys.argv[0]]
        sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
                         + "".join(traceback.format_exception_only(type(err), err)))
        sys.exit(1)


if __name__ == "__main__":
    main()
