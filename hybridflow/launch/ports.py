"""Where the rendezvous store listens, whether its port is free, and which port is.

The store of a local launch listens on the address ranks connect to (`distributed.master_addr`), never on
every interface: 127.0.0.1 (the default) keeps a single-node run's store off the machine's other addresses.
`store_socket` makes that listening socket; the launcher hands it to the store (rendezvous.py) and the port
checks bind through the same function, so a check and the store cannot disagree.
"""

from __future__ import annotations

import socket


def store_address(master_addr: str) -> tuple[socket.AddressFamily, str]:
    """(family, IP) the store binds for `master_addr`: the address itself, a host name resolved the way the
    ranks resolve it ("localhost" -> the loopback address); "" is every IPv4 interface."""
    if not master_addr:
        return socket.AF_INET, ""
    try:
        infos = socket.getaddrinfo(master_addr, None, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise OSError(f"cannot resolve {master_addr!r}: {err.strerror}") from None
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])


def store_socket(master_addr: str, port: int) -> socket.socket:
    """A socket listening on `master_addr:port` as TCPStore's own listener does (SO_REUSEADDR: sockets of a run
    that just ended, left in TIME_WAIT, do not block it; a socket still bound or listening does: OSError)."""
    family, host = store_address(master_addr)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


def port_is_free(port: int, master_addr: str = "127.0.0.1") -> bool:
    """True when the rendezvous store could listen on `master_addr:port` now (checked by binding as it binds;
    "" = every interface)."""
    try:
        store_socket(master_addr, port).close()
    except OSError:
        return False
    return True


def free_port(host: str = "") -> int:
    """A port the kernel considers free on `host` ("" = every IPv4 interface) right now (another process may
    still take it before we do)."""
    family, address = store_address(host)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]
