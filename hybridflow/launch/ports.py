"""Is a TCP port free for the rendezvous store, and which one is."""

from __future__ import annotations

import socket


def port_is_free(port: int, host: str = "") -> bool:
    """True when the rendezvous store could bind and listen on `host:port` now ("" = all interfaces).

    Checked the way the store binds: TCPStore sets SO_REUSEADDR, so sockets of a run that just ended,
    left in TIME_WAIT, do not stop it and must not stop us; a socket still listening (or bound) does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen()
        except OSError:
            return False
    return True


def free_port(host: str = "") -> int:
    """A port the kernel considers free right now (another process may still take it before we do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
