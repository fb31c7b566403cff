"""The launcher's console shows rank 0's output as rank 0 wrote it; every rank's output is in its log file.

Not torch's tee: it copies whole lines behind a `[default_role<R>]:` prefix, so a progress bar (which redraws
its line with a carriage return) came out as two prefixed lines per update, and every rank's copy of a message
was shown. Here the bytes of rank 0's stdout and stderr files go to this process's stdout and stderr
unchanged; other ranks speak through `LaunchError` when they fail (it quotes the failed rank's log).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TextIO

POLL_S = 0.1


class RankConsole:
    """Copies two files (named once the agent has created them) to two streams until `stop()`."""

    def __init__(self, paths: Callable[[], tuple[str, str] | None]) -> None:
        self._paths, self._stopped = paths, threading.Event()
        self._thread = threading.Thread(target=self._follow, name="rank0-console", daemon=True)

    def __enter__(self) -> RankConsole:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _follow(self) -> None:
        paths = None
        while paths is None:  # the agent names the files when it starts the workers
            paths = self._paths()
            if paths is None and self._stopped.wait(POLL_S):
                return
        sources: list[tuple[str, TextIO, BinaryIO | None]] = [
            (paths[0], sys.stdout, None), (paths[1], sys.stderr, None)]
        while True:
            stopping = self._stopped.is_set()  # read before the last copy: what was written by then is shown
            for i, (path, dst, src) in enumerate(sources):
                if src is None and Path(path).is_file():
                    src = open(path, "rb")  # noqa: SIM115  (held open across polls, closed below)
                    sources[i] = (path, dst, src)
                if src is not None:
                    chunk = src.read()
                    if chunk:
                        _write(dst, chunk)
            if stopping:
                break
            self._stopped.wait(POLL_S)
        for _, _, src in sources:
            if src is not None:
                src.close()


def _write(dst: TextIO, chunk: bytes) -> None:
    """Bytes as they are where the stream has a buffer (a terminal, a file); decoded where it has not."""
    buffer = getattr(dst, "buffer", None)
    if buffer is not None:
        dst.flush()
        buffer.write(chunk)
        buffer.flush()
    else:
        dst.write(chunk.decode(errors="replace"))
        dst.flush()
