"""Which isolation the sandboxed child gets on this machine, probed once.

Network: a new network namespace (`unshare --net`, which needs root, as on our machines and CI) with a new PID
namespace whose init the kernel kills with everything under it when the runner kills `unshare`
(`--kill-child`); else the child's audit hook refuses every `socket.*` event.
Processes: RLIMIT_NPROC binds no root user (the kernel exempts uid 0), so as root the child drops to uid/gid
65534 (`setpriv`), keeping only CAP_DAC_READ_SEARCH when the interpreter is unreadable to that user (ours lives
under /root); not root, RLIMIT_NPROC binds as it is; root unable to drop, the audit hook refuses forks.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

UNPRIVILEGED = 65534  # nobody/nogroup
_NAMESPACES = ("unshare", "--net", "--pid", "--fork", "--kill-child", "--")
_DROP = ("setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups")
_DROP_KEEP_READ = (*_DROP, "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search")


@dataclass(frozen=True)
class Isolation:
    """The command prefix before the interpreter, who the child runs as, and which guards are active."""

    prefix: tuple[str, ...]
    uid: int | None  # the uid the child runs as when it differs from ours (its scratch dir is chowned to it)
    network: str  # "network namespace" or "audit hook"
    processes: str  # how forks are bounded
    block_sockets: bool
    block_forks: bool

    def describe(self) -> str:
        """One line for logs and reports."""
        return f"network: {self.network}; processes: {self.processes}"


def _works(prefix: tuple[str, ...]) -> bool:
    if shutil.which(prefix[0]) is None:
        return False
    probe = [*prefix, sys.executable, "-I", "-c", "pass"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30, cwd="/").returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def probe_isolation() -> Isolation:
    """The strongest isolation that starts a Python child here (cached for the process)."""
    namespaces = _NAMESPACES if _works(_NAMESPACES) else ()
    network = "network namespace" if namespaces else "audit hook"
    if os.geteuid() != 0:
        return Isolation(namespaces, None, network, "RLIMIT_NPROC", not namespaces, False)
    for drop, how in ((_DROP, ""), (_DROP_KEEP_READ, " (keeping CAP_DAC_READ_SEARCH to read the interpreter)")):
        if _works((*namespaces, *drop)):
            return Isolation((*namespaces, *drop), UNPRIVILEGED, network,
                             f"RLIMIT_NPROC as uid {UNPRIVILEGED}{how}", not namespaces, False)
    return Isolation(namespaces, None, network, "audit hook refusing forks (root cannot be limited)",
                     not namespaces, True)
