"""The ``sgpu:`` tokens of a job's Slurm comment: parsed and written here, and only here.

A job tells slurmgpu what it agrees to in its ``--comment`` (``sgpu submit`` writes the
tokens; squeue and sacct show them to the daemon; plugins/job_submit.lua reads them at
submission). The comment is the user's own text, so nothing in it is trusted beyond the
rules below. The Lua plugin implements the same rules; both are tested against
``tests/vectors/sgpu_tokens.json`` (comment → what it means).

Words are what lies between ASCII whitespace (space, tab, newline, CR, VT, FF), commas and
semicolons: Lua's ``[^%s,;]+``. (Python's ``str.split()`` also splits at Unicode spaces
such as U+00A0, which Lua does not: a word like ``sgpu:rightsize\\u00a0x`` is no token on
either side.) A token is a whole word, matched exactly (case matters).

- ``sgpu:rightsize``: rightsize this job (``sgpu submit --rightsize``).
- ``sgpu:norightsize``: never rightsize this job, whatever else the comment or the site's
  ``apply_to_all`` says; it wins over ``sgpu:rightsize``.
- ``sgpu:shareable``: the job may share its GPU (co-location).
- ``sgpu:gpu-mem=MiB``: the most GPU memory the job uses (1 to 9 ASCII digits).
- ``sgpu:separated``: co-location split this job off a shared GPU; never pack it again.
- ``sgpu:malleable=MIN:MAX`` (GPUs) / ``sgpu:pool=MIN:MAX`` (array tasks running at once):
  1 <= MIN <= MAX, each 1 to 6 ASCII digits.
- ``sgpu:ckpt=SIGNAL:GRACE_S`` (a catchable signal's name without ``SIG``, 1 to 65535 s)
  and ``sgpu:edir=PATH`` (percent-encoded absolute, normalised path, at most 1024
  characters, no control characters): a malleable job's checkpoint options.

Of each kind of valued token the first well-formed one counts; a malformed one counts for
nothing (it never opts a job in: resizing needs an unambiguous yes) and is reported
(``Tokens.problems``) so the daemon can say why it was ignored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote, unquote

from slurmgpu.checkpoint_signal import CATCHABLE

__all__ = [
    "CHECKPOINT_SIGNALS",
    "CKPT",
    "EDIR",
    "GPU_MEM",
    "MALLEABLE",
    "MAX_DIR_CHARS",
    "MAX_GRACE_S",
    "NORIGHTSIZE",
    "POOL",
    "RIGHTSIZE",
    "SEPARATED",
    "SHAREABLE",
    "Malleable",
    "Tokens",
    "add_to_comment",
    "ckpt_tokens",
    "gpu_mem_token",
    "malleable_token",
    "parse",
    "rightsize_opted_in",
    "rightsize_opted_out",
    "words",
]

RIGHTSIZE = "sgpu:rightsize"
NORIGHTSIZE = "sgpu:norightsize"
SHAREABLE = "sgpu:shareable"
SEPARATED = "sgpu:separated"
GPU_MEM = "sgpu:gpu-mem"
MALLEABLE = "sgpu:malleable"
POOL = "sgpu:pool"
CKPT = "sgpu:ckpt"
EDIR = "sgpu:edir"

MAX_GRACE_S = 65535  # what sbatch --signal accepts
MAX_DIR_CHARS = 1024
# Signals a checkpoint request may use: any catchable one (never KILL or STOP).
CHECKPOINT_SIGNALS = CATCHABLE

_WORD_RE = re.compile(r"[^ \t\n\r\v\f,;]+")
_GPU_MEM_RE = re.compile(r"sgpu:gpu-mem=([0-9]{1,9})")
_MALLEABLE_RE = re.compile(r"(sgpu:malleable|sgpu:pool)=([0-9]{1,6}):([0-9]{1,6})")
_CKPT_RE = re.compile(r"sgpu:ckpt=([A-Z0-9+]{1,12}):([0-9]{1,6})")
_DIR_SAFE = "/._-~+@"


@dataclass(frozen=True, slots=True)
class Malleable:
    """A job's malleable range: GPUs, or for a pool, array tasks running at once."""

    lo: int
    hi: int
    pool: bool = False


@dataclass(frozen=True, slots=True)
class Tokens:
    """Everything a comment says to slurmgpu (the defaults: it says nothing)."""

    rightsize: bool = False  # sgpu:rightsize is there
    norightsize: bool = False  # sgpu:norightsize is there
    shareable: bool = False
    separated: bool = False
    gpu_mem_mib: int | None = None
    malleable: Malleable | None = None
    # the first malformed sgpu:malleable= / sgpu:pool= word when none is well-formed
    # (job_submit.lua logs it)
    malleable_bad: str | None = None
    ckpt_signal: str | None = None
    ckpt_grace_s: int | None = None
    elastic_dir: str | None = None
    problems: tuple[str, ...] = ()  # one line per malformed token, in comment order

    @property
    def rightsize_opted_in(self) -> bool:
        """Asked for rightsizing and did not refuse it."""
        return self.rightsize and not self.norightsize


def words(comment: str) -> list[str]:
    """The words of a comment, split as job_submit.lua splits them.

    >>> words("run 7, sgpu:rightsize;nightly")
    ['run', '7', 'sgpu:rightsize', 'nightly']
    """
    return _WORD_RE.findall(comment)


def _state_dir(value: str) -> str | None:
    try:
        path = unquote(value, errors="strict")
    except UnicodeDecodeError:
        return None
    ok = (
        0 < len(path) <= MAX_DIR_CHARS
        and os.path.isabs(path)
        and os.path.normpath(path) == path
        and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in path)
    )
    return path if ok else None


def parse(comment: str) -> Tokens:
    """Every ``sgpu:`` token of ``comment``, by the rules above.

    >>> t = parse("run 3 sgpu:shareable,sgpu:gpu-mem=8192 sgpu:malleable=0:2 sgpu:pool=1:4")
    >>> t.shareable, t.gpu_mem_mib, t.malleable, t.problems
    (True, 8192, Malleable(lo=1, hi=4, pool=True), ("'sgpu:malleable=0:2' is not sgpu:malleable=MIN:MAX with 1 <= MIN <= MAX",))
    """  # noqa: E501
    if "sgpu:" not in comment:
        return _NOTHING
    rightsize = norightsize = shareable = separated = False
    gpu_mem: int | None = None
    malleable: Malleable | None = None
    malleable_bad: str | None = None
    sig: str | None = None
    grace: int | None = None
    state_dir: str | None = None
    problems: list[str] = []
    for word in words(comment):
        if not word.startswith("sgpu:"):
            continue
        name, eq, value = word.partition("=")
        shown = repr(word[:60])
        if not eq:
            rightsize |= word == RIGHTSIZE
            norightsize |= word == NORIGHTSIZE
            shareable |= word == SHAREABLE
            separated |= word == SEPARATED
        elif name == GPU_MEM:
            if gpu_mem is None:
                m = _GPU_MEM_RE.fullmatch(word)
                if m:
                    gpu_mem = int(m.group(1))
                else:
                    problems.append(f"{shown} is not {GPU_MEM}=MiB")
        elif name in (MALLEABLE, POOL):
            if malleable is None:
                m = _MALLEABLE_RE.fullmatch(word)
                lo, hi = (int(m.group(2)), int(m.group(3))) if m else (0, 0)
                if m and 1 <= lo <= hi:
                    malleable = Malleable(lo, hi, name == POOL)
                else:
                    malleable_bad = malleable_bad or word
                    problems.append(f"{shown} is not {name}=MIN:MAX with 1 <= MIN <= MAX")
        elif name == CKPT:
            if sig is None:
                m = _CKPT_RE.fullmatch(word)
                if m and m.group(1) in CHECKPOINT_SIGNALS and 1 <= int(m.group(2)) <= MAX_GRACE_S:
                    sig, grace = m.group(1), int(m.group(2))
                else:
                    problems.append(f"{shown} is not {CKPT}=SIGNAL:SECONDS")
        elif name == EDIR and state_dir is None:
            state_dir = _state_dir(value)
            if state_dir is None:
                problems.append(f"{shown} is not an absolute, normalised directory")
    return Tokens(
        rightsize,
        norightsize,
        shareable,
        separated,
        gpu_mem,
        malleable,
        None if malleable is not None else malleable_bad,
        sig,
        grace,
        state_dir,
        tuple(problems),
    )


_NOTHING = Tokens()


def rightsize_opted_in(comment: str) -> bool:
    """True when the comment asks for rightsizing and does not refuse it.

    >>> rightsize_opted_in("sgpu:rightsize"), rightsize_opted_in("sgpu:rightsize sgpu:norightsize")
    (True, False)
    """
    if RIGHTSIZE not in comment:
        return False
    found = words(comment)
    return RIGHTSIZE in found and NORIGHTSIZE not in found


def rightsize_opted_out(comment: str) -> bool:
    """True when the comment refuses rightsizing (``sgpu:norightsize``).

    >>> rightsize_opted_out("sgpu:norightsize,x"), rightsize_opted_out("sgpu:norightsizeX")
    (True, False)
    """
    return NORIGHTSIZE in comment and NORIGHTSIZE in words(comment)


def gpu_mem_token(mib: int) -> str:
    """``sgpu:gpu-mem=MiB``."""
    return f"{GPU_MEM}={int(mib)}"


def malleable_token(lo: int, hi: int, *, pool: bool = False) -> str:
    """``sgpu:malleable=MIN:MAX`` (or ``sgpu:pool=``); ValueError unless 1 <= MIN <= MAX."""
    if not 1 <= lo <= hi:
        raise ValueError(f"{lo}:{hi}: need 1 <= MIN <= MAX")
    return f"{POOL if pool else MALLEABLE}={lo}:{hi}"


def ckpt_tokens(signal_name: str, grace_s: int, state_dir: str) -> list[str]:
    """The tokens carrying a malleable job's checkpoint signal, grace and state dir."""
    return [f"{CKPT}={signal_name}:{grace_s}", f"{EDIR}={quote(state_dir, safe=_DIR_SAFE)}"]


def add_to_comment(comment: str, tokens: Iterable[str]) -> str:
    """``comment`` (kept as it is, unless blank) with the ``tokens`` it does not carry yet
    appended, space-separated.

    >>> add_to_comment("run 3 sgpu:shareable", ["sgpu:shareable", "sgpu:separated"])
    'run 3 sgpu:shareable sgpu:separated'
    """
    have = set(words(comment))
    parts = [comment] if comment.strip() else []
    for token in tokens:
        if token not in have:
            parts.append(token)
            have.add(token)
    return " ".join(parts)
