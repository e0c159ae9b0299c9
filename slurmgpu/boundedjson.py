"""JSON that nobody vouches for, decoded within a size and a nesting bound.

Python's ``json`` (and msgspec) decode nested arrays and objects by recursion: 60,000
``[`` in a 60 KB file raise :class:`RecursionError` (not a ``ValueError``), which a
caller that catches decode errors does not expect. :func:`loads` measures the nesting
first, with a linear scan that never recurses (regular expressions and C loops), and
refuses a document deeper than its
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
from itertools import accumulate
from typing import Any, Final

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_DEPTH", "JsonRejected", "depth_exceeds", "loads"]

DEFAULT_MAX_BYTES: Final = 64 * 1024
DEFAULT_MAX_DEPTH: Final = 16

# A string, escapes included; one left open runs to the end (so no match ever fails,
# and the scan stays linear whatever the quotes and backslashes).
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEP: Final = tuple(1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256))


class JsonRejected(ValueError):
    """A document refused; ``cause`` says why in a few words (no content quoted)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


def depth_exceeds(data: bytes, max_depth: int) -> bool:
    """True when arrays and objects in ``data`` nest deeper than ``max_depth``.

    Brackets inside strings do not count. Linear, in C loops (no recursion, no Python
    loop per byte): strings are cut out, the brackets kept, and the most brackets open
    at once is the largest running sum of +1 per opener and -1 per closer. For JSON
    that is its depth; for text that is not JSON it is at least how deep a decoder gets
    before it fails (it fails at the first closer too many, before the sum drops below
    zero), which is what matters; :func:`loads` refuses such text anyway.

    >>> depth_exceeds(b'{"a": "[[[["}', 1), depth_exceeds(b'[[1]]', 1)
    (False, True)
    """
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    if len(brackets) <= max_depth:
        return False
    return max(accumulate(map(_STEP.__getitem__, brackets))) > max_depth


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
