"""A free TCP port on 127.0.0.1 for a server a test starts (the kernel picks it)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now; the caller binds it soon after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
