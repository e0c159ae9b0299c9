"""Text that users control (job names, comments, accounts, partitions), made safe to show.

Any Slurm user picks their job's name and comment, so what ``squeue`` returns may hold
Rich markup (``[/bold]`` crashes a table that parses it), terminal escape sequences
(``\\x1b]0;...`` retitles or recolours the admin's terminal), line breaks that forge log
lines or mail headers, bidirectional overrides that reorder what is read, and lone
surrogates that no terminal encoding accepts. Every renderer passes such text through
:func:`shown` (or :func:`plain` for Rich, :func:`csv_cell` for spreadsheets): the
characters are kept, visibly escaped, and nothing is interpreted.

Examples:
    >>> shown("train\\x1b[31m")
    'train\\\\x1b[31m'
    >>> shown("a\\nb")
    'a\\\\nb'
    >>> csv_cell("=HYPERLINK(1)")
    "'=HYPERLINK(1)"
"""

from __future__ import annotations

import logging
import re
import unicodedata

from rich.text import Text

__all__ = [
    "EscapingLogFilter",
    "csv_cell",
    "install_log_filter",
    "plain",
    "shown",
    "template_finalize",
]

# Unicode format characters that change how the text around them is ordered or hidden
# (the "Trojan Source" set); other format characters (soft hyphen, ZWJ in emoji) stay.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# A fast pre-check: most names are plain ASCII letters, digits and punctuation.
_SAFE = re.compile(r"[\x20-\x7e]*")
# A spreadsheet runs a cell that starts with one of these as a formula (OWASP CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def _needs_escape(ch: str) -> bool:
    if ch in _BIDI:
        return True
    # Cc: C0, DEL and C1 controls; Cs: lone surrogates (undecodable bytes); Zl/Zp: the
    # Unicode line and paragraph separators, which some viewers break lines on.
    return unicodedata.category(ch) in {"Cc", "Cs", "Zl", "Zp"}


def shown(text: object) -> str:
    """Return ``text`` as a string with control characters shown as escapes (``\\x1b``)."""
    s = text if isinstance(text, str) else str(text)
    if _SAFE.fullmatch(s):
        return s
    return "".join(_escape(ch) if _needs_escape(ch) else ch for ch in s)


def plain(text: object, style: str = "") -> Text:
    """Return a Rich cell that shows ``text`` literally: no markup, controls escaped."""
    return Text(shown(text), style=style)


def csv_cell(text: object) -> str:
    """Return ``text`` for a CSV cell: controls escaped, a formula start defused with ``'``."""
    s = shown(text)
    return "'" + s if s.startswith(_FORMULA_START) else s


class EscapingLogFilter(logging.Filter):
    """Escapes control characters in every log message, so a job name cannot forge a line.

    Installed on the CLI's and the agent's log handlers; the message is rendered once
    (``%`` arguments applied) and stored back, so formatters see the safe text.
    A traceback (added later by the formatter) keeps its line breaks.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        safe = shown(message)
        if safe is not message:
            record.msg = safe
            record.args = None
        return True


def install_log_filter(handlers: list[logging.Handler] | None = None) -> None:
    """Add :class:`EscapingLogFilter` to ``handlers`` (default: the root logger's)."""
    for handler in handlers if handlers is not None else logging.getLogger().handlers:
        if not any(isinstance(f, EscapingLogFilter) for f in handler.filters):
            handler.addFilter(EscapingLogFilter())


def template_finalize(value: object) -> object:
    """Jinja ``finalize``: every ``{{ value }}`` of text has its controls escaped.

    Markup (already-safe HTML built by our code) passes unchanged; HTML autoescaping,
    where on, still applies after this.
    """
    if isinstance(value, str) and not hasattr(value, "__html__"):
        return shown(value)
    return value
