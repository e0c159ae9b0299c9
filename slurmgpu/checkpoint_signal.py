"""The checkpoint signal: one a process can catch, named one way everywhere.

A malleable job is asked to checkpoint with a signal (``sgpu submit --checkpoint-signal``,
written into sbatch's ``--signal=B:SIG@GRACE``, the ``sgpu:ckpt=SIG:GRACE`` comment token
and ``SGPU_CHECKPOINT_SIGNAL`` for ``sgpu launch`` and the job's runtime). KILL and
STOP cannot be caught: "checkpoint now" would kill or freeze the job instead, so they
are refused wherever a signal is read. :func:`checkpoint_signal` reads a name or a number
(``USR2``, ``SIGUSR2``, ``usr2``, ``12``) and gives its canonical name without ``SIG``
(what sbatch and the token take); :func:`checkpoint_signal_number` the signal itself.

Examples:
    >>> checkpoint_signal("sigusr1"), checkpoint_signal("15"), checkpoint_signal("IOT")
    ('USR1', 'TERM', 'ABRT')
    >>> checkpoint_signal("KILL")
    Traceback (most recent call last):
    ...
    ValueError: SIGKILL cannot be caught, so it cannot ask for a checkpoint (use e.g. USR2)
"""

from __future__ import annotations

import signal
from typing import Final

__all__ = ["CATCHABLE", "UNCATCHABLE", "checkpoint_signal", "checkpoint_signal_number"]

UNCATCHABLE: Final = frozenset({signal.SIGKILL, signal.SIGSTOP})
# Names (without SIG) of the signals a checkpoint request may use.
CATCHABLE: Final = frozenset(
    s.name.removeprefix("SIG")
    for s in signal.Signals
    if s.name.startswith("SIG") and s not in UNCATCHABLE
)


def checkpoint_signal_number(text: str) -> signal.Signals:
    """The catchable signal ``text`` names (a name with or without ``SIG``, any case, or
    a number); ValueError with a one-line reason otherwise."""
    given = text.strip().upper()
    shown = repr(text[:20])
    if given.isascii() and given.isdigit():
        try:
            sig = signal.Signals(int(given) if len(given) <= 6 else -1)
        except ValueError:
            raise ValueError(f"{shown} is not a signal number") from None
    else:
        name = given if given.startswith("SIG") else "SIG" + given
        try:
            sig = signal.Signals[name]
        except KeyError:
            raise ValueError(f"{shown} is not a signal name like USR2") from None
    if sig in UNCATCHABLE:
        raise ValueError(
            f"{sig.name} cannot be caught, so it cannot ask for a checkpoint (use e.g. USR2)"
        )
    return sig


def checkpoint_signal(text: str) -> str:
    """The canonical name (``USR2``) of the catchable signal ``text`` names; ValueError
    with a one-line reason otherwise."""
    return checkpoint_signal_number(text).name.removeprefix("SIG")
