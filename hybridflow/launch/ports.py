"""Is a TCP port free for the rendezvous store, and which one is."""

from __future__ import annotations

import socket


def port_is_free(port: int, host: str = "") -> bool:
    """True when a listening socket can bind `host:port` now ("" = all interfaces, as TCPStore binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # No SO_REUSEADDR: a port in TIME_WAIT would be reported free but still refuse the store's bind
        # on some kernels; erring towards "busy" only costs the user a different port number.
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "") -> int:
    """A port the kernel considers free right now (another process may still take it before we do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
