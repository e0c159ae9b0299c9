"""SQL functions the store and the reports need that SQLite and PostgreSQL spell differently.

- :class:`epoch_s`: a timestamp column as seconds since 1970 (float). SQLite stores
  SQLAlchemy timestamps as UTC text ``YYYY-MM-DD HH:MM:SS.ffffff``; PostgreSQL has
  ``EXTRACT(EPOCH FROM ...)``.
- :class:`unindexed`: a column the planner must not use an index for (SQLite's unary
  ``+``; other databases plan this well themselves and get the plain column).
- :class:`floor_div`: ``floor(x / step)`` as an integer, for histogram and time buckets
  (``CAST(... AS INTEGER)`` truncates on SQLite but rounds on PostgreSQL; the reports
  only divide non-negative numbers, where truncation is the floor).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float, Integer
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

__all__ = ["epoch_s", "floor_div", "unindexed"]


class epoch_s(FunctionElement[float]):
    """Seconds since the Unix epoch of a UTC timestamp column."""

    type = Float()
    inherit_cache = True
    name = "epoch_s"

    def __init__(self, column: ColumnElement[Any]) -> None:
        super().__init__(column)


class floor_div(FunctionElement[int]):
    """``floor(x / step)`` for non-negative ``x`` and positive ``step``."""

    type = Integer()
    inherit_cache = True
    name = "floor_div"

    def __init__(self, x: ColumnElement[Any], step: ColumnElement[Any]) -> None:
        super().__init__(x, step)


def _args(element: FunctionElement[Any], compiler: SQLCompiler, **kw: Any) -> list[str]:
    return [compiler.process(c, **kw) for c in element.clauses]


@compiles(epoch_s, "sqlite")
def _epoch_sqlite(element: epoch_s, compiler: SQLCompiler, **kw: Any) -> str:
    # Whole seconds from unixepoch() (SQLite >= 3.38) plus the stored ".ffffff": exact,
    # where julianday() would be off by ~10 us (a 2.46e6-day float) and turn a 3600 s
    # wait into 3599.99999 s.
    (col,) = _args(element, compiler, **kw)
    return f"(unixepoch({col}) + CAST(substr({col}, 20) AS REAL))"


@compiles(epoch_s)
def _epoch_default(element: epoch_s, compiler: SQLCompiler, **kw: Any) -> str:
    (col,) = _args(element, compiler, **kw)
    return f"CAST(EXTRACT(EPOCH FROM {col}) AS DOUBLE PRECISION)"


@compiles(floor_div, "sqlite")
def _floor_sqlite(element: floor_div, compiler: SQLCompiler, **kw: Any) -> str:
    x, step = _args(element, compiler, **kw)
    return f"CAST(({x}) / ({step}) AS INTEGER)"


@compiles(floor_div)
def _floor_default(element: floor_div, compiler: SQLCompiler, **kw: Any) -> str:
    x, step = _args(element, compiler, **kw)
    return f"CAST(FLOOR(({x}) / ({step})) AS INTEGER)"


class unindexed(FunctionElement[Any]):
    """``column`` without its index (SQLite: ``+column``), for full-table reads."""

    inherit_cache = True
    name = "unindexed"

    def __init__(self, column: ColumnElement[Any]) -> None:
        super().__init__(column)
        self.type = column.type


@compiles(unindexed, "sqlite")
def _unindexed_sqlite(element: unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    (col,) = _args(element, compiler, **kw)
    return f"+{col}"


@compiles(unindexed)
def _unindexed_default(element: unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    (col,) = _args(element, compiler, **kw)
    return col
