"""JSON that nobody vouches for, decoded within a size and a nesting bound.

Python's ``json`` (and msgspec) decode nested arrays and objects by recursion: 60,000
``[`` in a 60 KB file raise :class:`RecursionError` (not a ``ValueError``), which a
caller that catches decode errors does not expect. :func:`loads` measures the nesting
first, with a linear scan that never recurses, and refuses a document deeper than its
bound before ``json`` sees it; whatever still goes wrong in the decoder (bad UTF-8, a
syntax error, an integer of more digits than Python converts, memory) is the same one
:class:`JsonRejected`, whose ``cause`` is a short phrase for a log line.

``NaN`` and ``Infinity`` are decoded (Python's ``json.dumps`` writes them); callers that
need finite numbers check.

Examples:
    >>> loads(b'{"a": [1, {"b": 2}]}', max_depth=3)
    {'a': [1, {'b': 2}]}
    >>> loads(b"[" * 5 + b"]" * 5, max_depth=4)
    Traceback (most recent call last):
    ...
    slurmgpu.boundedjson.JsonRejected: nested deeper than 4
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_DEPTH", "JsonRejected", "depth_exceeds", "loads"]

DEFAULT_MAX_BYTES: Final = 64 * 1024
DEFAULT_MAX_DEPTH: Final = 16

# The bytes that matter to nesting: brackets, and the quotes and backslashes that say
# whether a bracket is inside a string.
_SPECIAL: Final = re.compile(rb'[\[\]{}"\\]')
_OPEN: Final = frozenset(b"[{")
_CLOSE: Final = frozenset(b"]}")
_QUOTE: Final = ord('"')
_BACKSLASH: Final = ord("\\")


class JsonRejected(ValueError):
    """A document refused; ``cause`` says why in a few words (no content quoted)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


def depth_exceeds(data: bytes, max_depth: int) -> bool:
    """True when arrays and objects in ``data`` nest deeper than ``max_depth``.

    Brackets inside strings do not count. A document that is not JSON may give either
    answer; :func:`loads` refuses it anyway. One pass, no recursion, stops at the first
    bracket too deep.

    >>> depth_exceeds(b'{"a": "[[[["}', 1), depth_exceeds(b'[[1]]', 1)
    (False, True)
    """
    depth = 0
    in_string = False
    escaped_at = -1  # the position of the byte a backslash escapes
    for m in _SPECIAL.finditer(data):
        at = m.start()
        if at == escaped_at:
            continue
        byte = data[at]
        if in_string:
            if byte == _BACKSLASH:
                escaped_at = at + 1
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            if depth > max_depth:
                return True
        elif byte in _CLOSE:
            depth = max(depth - 1, 0)
    return False


def loads(
    data: bytes, *, max_depth: int = DEFAULT_MAX_DEPTH, max_bytes: int = DEFAULT_MAX_BYTES
) -> Any:
    """``data`` (UTF-8 JSON) decoded; :class:`JsonRejected` when it is over ``max_bytes``,
    nested deeper than ``max_depth``, not UTF-8 or not JSON. Never raises anything else
    for any input."""
    if len(data) > max_bytes:
        raise JsonRejected(f"larger than {max_bytes} bytes")
    if depth_exceeds(data, max_depth):
        raise JsonRejected(f"nested deeper than {max_depth}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise JsonRejected("not UTF-8 text") from None
    try:
        return json.loads(text)
    except RecursionError:  # not reached past the scan; kept so no input can escape
        raise JsonRejected(f"nested deeper than {max_depth}") from None
    except MemoryError:
        raise JsonRejected("too large to decode") from None
    except ValueError:  # JSONDecodeError, or an integer of too many digits
        raise JsonRejected("not valid JSON") from None
