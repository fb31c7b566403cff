"""The master-port check agrees with how the rendezvous store binds (SO_REUSEADDR, as TCPStore does)."""

from __future__ import annotations

import socket

from hybridflow.launch.ports import port_is_free, store_address, store_socket


def _time_wait_port() -> int:
    """A port whose only socket is in TIME_WAIT: the server side closes first (as a killed store does).

    The server sets SO_REUSEADDR as TCPStore's listener does (Linux lets a new bind through TIME_WAIT only
    when both sockets set it)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the side that closes first holds TIME_WAIT
    server.close()
    client.recv(1)  # EOF: the close reached the client
    client.close()
    return port


def test_time_wait_socket_does_not_make_the_port_busy():
    port = _time_wait_port()
    with open("/proc/net/tcp") as f:  # the port really is in TIME_WAIT (state 06) now
        assert any(line.split()[1].endswith(f":{port:04X}") and line.split()[3] == "06" for line in f)
    assert port_is_free(port)


def test_listening_socket_makes_the_port_busy():
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("", 0))
        busy.listen()
        assert not port_is_free(busy.getsockname()[1])


def test_port_check_binds_where_the_store_listens():
    """A store on 127.0.0.1 makes the port busy for master_addr 127.0.0.1 and localhost, and for every interface."""
    with store_socket("127.0.0.1", 0) as store:
        port = store.getsockname()[1]
        assert store.getsockname()[0] == "127.0.0.1"
        assert not port_is_free(port, "127.0.0.1")
        assert not port_is_free(port, "localhost")
        assert not port_is_free(port, "")


def test_store_address_resolves_names_as_ranks_do():
    assert store_address("127.0.0.1") == (socket.AF_INET, "127.0.0.1")
    assert store_address("localhost")[1] in ("127.0.0.1", "::1")
    assert store_address("") == (socket.AF_INET, "")
