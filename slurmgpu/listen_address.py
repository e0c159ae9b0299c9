"""The API's ``HOST:PORT`` (``[daemon] listen``, ``sgpu daemon --listen``), checked where
it is read rather than when the daemon first binds it.

HOST is an IPv4 address (``127.0.0.1``), an IPv6 address in brackets (``[::1]``), a host
name by RFC 1123 (letters, digits and hyphens in dot-separated labels of at most 63
characters, 253 in all; the last label not all digits, so ``999.1.1.1`` is a bad IPv4
address rather than a name), or nothing (``:8787``: localhost). PORT is 1 to 65535.

Examples:
    >>> parse_listen("127.0.0.1:8787"), parse_listen("[::1]:9000"), parse_listen(":8787")
    (('127.0.0.1', 8787), ('::1', 9000), ('127.0.0.1', 8787))
    >>> parse_listen("999.1.1.1:99999")
    Traceback (most recent call last):
    ...
    ValueError: port '99999' is not between 1 and 65535
    >>> parse_listen("999.1.1.1:8787")
    Traceback (most recent call last):
    ...
    ValueError: '999.1.1.1' is not an IPv4 address
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

__all__ = ["DEFAULT_HOST", "parse_listen", "valid_host"]

DEFAULT_HOST: Final = "127.0.0.1"
_LABEL: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_NUMERIC_LABEL: Final = re.compile(r"[0-9]+")
_MAX_NAME: Final = 253


def valid_host(host: str) -> str | None:
    """Why ``host`` (no brackets, no port) is not an IP address or an RFC 1123 host name;
    None when it is one."""
    if not host.isascii():
        return f"{host[:64]!r} is not an IP address or a host name (ASCII only)"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return None
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        return f"{host[:64]!r} is not an IPv4 address"
    if len(name) > _MAX_NAME or not all(_LABEL.fullmatch(label) for label in labels):
        return f"{host[:64]!r} is not an IP address or a host name"
    return None


def parse_listen(listen: str) -> tuple[str, int]:
    """(host, port) from ``HOST:PORT``; ValueError with a one-line reason otherwise
    (the reason does not repeat ``listen``: the caller says where it came from)."""
    host, sep, port = listen.rpartition(":")
    if not sep:
        raise ValueError("no port (HOST:PORT, like 127.0.0.1:8787)")
    if not (port.isascii() and port.isdigit() and len(port) <= 5) or not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port[:20]!r} is not between 1 and 65535")
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise ValueError(f"{inner[:64]!r} is not an IPv6 address") from None
        return inner, int(port)
    if ":" in host or "[" in host or "]" in host:
        raise ValueError("an IPv6 address goes in brackets, like [::1]:8787")
    if not host:
        return DEFAULT_HOST, int(port)
    problem = valid_host(host)
    if problem is not None:
        raise ValueError(problem)
    return host, int(port)
