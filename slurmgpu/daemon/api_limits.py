"""How much of the daemon the API's peers may hold (``ApiLimits``, docs/reliability.md) and
what the server counts against those limits (``ApiStats``, served in /metrics)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ApiLimits:
    """How much of the daemon one peer, or all of them, can hold (docs/reliability.md)."""

    max_connections: int = 32  # served at once (headers in); one more is answered 503
    max_per_peer: int = 8  # of those, from one address (a node's agent needs one)
    # Connections still sending their request line and headers: each holds a thread and
    # at most max_header_bytes, for at most header_timeout_s; they take no served slot, so
    # clients trickling headers (slowloris) cannot keep an agent's request from a slot.
    max_pending: int = 256
    max_pending_per_peer: int = 16
    header_timeout_s: float = 5.0  # the request line and headers, from the connection's start
    max_header_bytes: int = 16 * 1024
    idle_timeout_s: float = 10.0  # one read or write waiting longer closes the connection
    request_timeout_s: float = 30.0  # a whole request: its wait, headers and body
    retry_after_s: int = 5  # what a 503 tells the client to wait


@dataclass
class ApiStats:
    """What the server counts for /metrics."""

    active: int = 0  # connections served (their headers in)
    pending: int = 0  # connections still sending their headers
    overloaded: int = 0  # connections answered 503 because every slot was taken
    peer_overloaded: int = 0  # answered 503 because their address held max_per_peer
    pending_overloaded: int = 0  # closed at once: too many connections sending headers
    timeouts: int = 0  # connections closed because a read or a request took too long
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)
