"""How ``sgpu`` logs: slurmgpu's own events at INFO, libraries' chatter only when asked.

- default: slurmgpu's loggers at INFO (one line per event a person needs), every other
  logger (Alembic's migration notes, SQLAlchemy, HTTP) at WARNING;
- ``-v``: libraries' INFO too; ``-vv``: everything at DEBUG; ``-q``: warnings and errors;
- ``--log-format json`` (or ``SGPU_LOG_FORMAT=json``): one JSON object per line, for
  journald, Loki and the like; the default ``text`` is one line with a timestamp.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from slurmgpu.plaintext import EscapingLogFilter

FORMATS = ("text", "json")
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_DATE = "%Y-%m-%dT%H:%M:%S"
_MARK = "_sgpu_handler"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``msg`` (+ ``exc``)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def levels(verbose: int, quiet: bool) -> tuple[int, int]:
    """(level of slurmgpu's loggers, level of everything else) for ``-v``/``-q``."""
    if quiet:
        return logging.WARNING, logging.WARNING
    if verbose >= 2:
        return logging.DEBUG, logging.DEBUG
    return logging.INFO, logging.INFO if verbose == 1 else logging.WARNING


def configure(verbose: int = 0, quiet: bool = False, fmt: str = "text") -> None:
    """Set sgpu's one stderr handler up (again: a later call replaces the earlier one)."""
    ours, others = levels(verbose, quiet)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _MARK, False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    setattr(handler, _MARK, True)
    # Job names and other user text in log lines: control characters shown escaped.
    handler.addFilter(EscapingLogFilter())
    handler.setFormatter(
        JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT, datefmt=_DATE)
    )
    root.addHandler(handler)
    root.setLevel(others)
    logging.getLogger("slurmgpu").setLevel(ours)


def set_format(fmt: str) -> None:
    """Switch the handler :func:`configure` installed to ``fmt``, keeping the levels."""
    for handler in logging.getLogger().handlers:
        if getattr(handler, _MARK, False):
            handler.setFormatter(
                JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT, datefmt=_DATE)
            )
