"""Hypothesis strategies that damage a JSON document the way real trouble does.

A mutation walks to a random place in the document and replaces the value there with a
hostile one (wrong type, huge or negative number, odd string, deep nesting), deletes
it, adds an unknown key, or damages the bytes (truncation, a flipped byte, a second
document appended). Used for Slurm's JSON and for the agents' ingest payloads.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

hostile_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, -(2**63) - 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e308, -1e308, 5e-324, 0.5, 1e9, 1e11]),
    st.text(max_size=30),
    st.sampled_from(["", "\x00", "(null)", "N/A", "UNLIMITED", "9" * 5000, "a" * 70000]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.just({"set": True, "infinite": False, "number": 2**64}),
    st.just([[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]),
)


def _paths(doc: Any, prefix: tuple[Any, ...] = (), limit: int = 4000) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    stack = [(prefix, doc)]
    while stack and len(out) < limit:
        path, node = stack.pop()
        out.append(path)
        if isinstance(node, dict):
            stack.extend(((*path, k), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend(((*path, i), v) for i, v in enumerate(node))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def damaged_json(draw: st.DrawFn, doc: Any, max_mutations: int = 3) -> bytes:
    """``doc`` (a parsed JSON value) with 1..max_mutations damages, encoded."""
    data = copy.deepcopy(doc)
    paths = _paths(data)
    for _ in range(draw(st.integers(1, max_mutations))):
        path = draw(st.sampled_from(paths))
        how = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add"]))
        if not path:
            if how == "replace":
                data = copy.deepcopy(draw(hostile_values))
                paths = [()]
            continue
        try:
            parent = _get(data, path[:-1])
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this place
        key = path[-1]
        try:
            if how == "replace":
                parent[key] = copy.deepcopy(draw(hostile_values))
            elif how == "delete":
                del parent[key]
            elif isinstance(parent, dict):
                parent[draw(st.text(min_size=1, max_size=12))] = copy.deepcopy(draw(hostile_values))
            elif isinstance(parent, list):
                parent.append(copy.deepcopy(draw(hostile_values)))
        except (KeyError, IndexError, TypeError):
            continue
    raw = json.dumps(data).encode()
    damage = draw(st.sampled_from(["none", "none", "none", "truncate", "flip", "append"]))
    if damage == "truncate" and raw:
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif damage == "flip" and raw:
        i = draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + bytes([draw(st.integers(0, 255))]) + raw[i + 1 :]
    elif damage == "append":
        raw = raw + b"\n" + raw[: draw(st.integers(0, min(len(raw), 200)))]
    return raw
