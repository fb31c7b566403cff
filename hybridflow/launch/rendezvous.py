"""The rendezvous of a local launch: torch's static rendezvous, with a store that listens where we say.

torch's "static" backend builds its TCPStore from a host and a port, and the store's server then listens on
every interface (`*:PORT`) whatever the host: during a single-node run anyone who can reach the machine could
talk to it. TCPStore also accepts a socket that is already listening (`master_listen_fd`); this backend hands it
one bound to `distributed.master_addr` (hybridflow.launch.ports.store_socket), so the store listens on
127.0.0.1 for the default single-node run and on the configured address otherwise.
"""

from __future__ import annotations

import socket
from datetime import timedelta

from torch.distributed import PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo, RendezvousParameters
from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as registry
from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

BACKEND = "hybridflow-static"
LISTENER = "listener"  # the rdzv_configs key of the listening socket (its owner until the store takes it)


class BoundStoreRendezvous(RendezvousHandler):
    """One node, rank 0: the agent's store listens on the socket it is given; workers connect to the endpoint."""

    def __init__(self, params: RendezvousParameters) -> None:
        self.master_addr, self.master_port = parse_rendezvous_endpoint(params.endpoint, -1)
        self.run_id = params.run_id
        self.timeout = timedelta(seconds=int(params.config.get("timeout", 900)))
        self._listener: socket.socket = params.config[LISTENER]
        self._store: TCPStore | None = None

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True  # workers join the agent's store at MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE)

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            # detach: the store's server owns the descriptor from here on and closes it when it stops.
            self._store = TCPStore(self.master_addr, self.master_port, 1, True, self.timeout,
                                   master_listen_fd=self._listener.detach())
        return RendezvousInfo(PrefixStore(self.run_id, self._store), 0, 1,
                              RendezvousStoreInfo(self.master_addr, self.master_port))

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        return True


registry.register(BACKEND, BoundStoreRendezvous)
