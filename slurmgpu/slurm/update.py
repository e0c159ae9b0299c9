"""Slurm syntax of typed intents: ``scontrol update`` fields per release, and back.

The one place that spells a policy's change (:mod:`slurmgpu.intent`) the way Slurm takes
it. Releases differ in one spelling only, the GRES of ``TresPerNode`` / ``TresPerJob``:
22.05 prints and accepts ``gres:gpu:2`` and silently ignores ``gres/gpu:2``; from 23.02
(24.11, 26.05: the golden captures under ``tests/golden``) it is ``gres/gpu:2``. The
other fields are spelt alike in every release we support::

    SetTimeLimit(5400)            TimeLimit=01:30:00        (None: UNLIMITED)
    SetMemoryPerNode(4096)        MinMemoryNode=4096
    SetCpus(8)                    NumCPUs=8
    SetCpusPerNode(4)             MinCPUsNode=4
    SetGpus(2, "a100")            TresPerNode=gres/gpu:a100:2   (per_node=False: TresPerJob)
    NarrowToShards(2)             TresPerNode=gres/shard:2
    NarrowToMps(50)               TresPerNode=gres/mps:50
    SetGpus(1, "1g.10gb")         TresPerNode=gres/gpu:1g.10gb:1  (a MIG slice is a GPU type)
    SetNodes(2)                   NumNodes=2
    SetComment("x sgpu:y")        Comment=x sgpu:y
    SetAdminComment("sgpu-eff…")  AdminComment=sgpu-eff…
    SetNice(200)                  Nice=200
    StartSoon(1)                  StartTime=now+1

A ``resize`` (:class:`~slurmgpu.intent.Resize`, :class:`~slurmgpu.intent.Preempt`) is
no single update: ``cycle.resize`` renders the held job's update from the job's own
request. The audit records it as ``from_gpus`` / ``to_gpus`` (and ``gpu_type``,
``preempt``) beside the update fields (:func:`audit_fields`), the format rows have always
had. :func:`parse_fields` reads either back into intents: ``actuate.confirm`` compares
those with what Slurm lists, and ``parse_fields(audit_fields(i, v)) == i`` for every
intent and release (tests/unit/test_slurm_update.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from slurmgpu.intent import (
    Intent,
    NarrowToMps,
    NarrowToShards,
    Preempt,
    Resize,
    SetAdminComment,
    SetComment,
    SetCpus,
    SetCpusPerNode,
    SetGpus,
    SetMemoryPerNode,
    SetNice,
    SetNodes,
    SetTimeLimit,
    StartSoon,
)
from slurmgpu.slurm.parse import (
    SlurmValueError,
    format_time_limit,
    parse_gres,
    parse_memory_mib,
    parse_time_limit,
)

__all__ = [
    "PREEMPT_KEY",
    "UPDATE_FIELDS",
    "UpdateFieldError",
    "audit_fields",
    "field_name",
    "gres_prefix",
    "parse_fields",
    "spelt_alike",
    "update_fields",
]

_VERSION_RE = re.compile(r"(\d+)\.(\d+)")
_START_RE = re.compile(r"now\+(\d+)")
# Every ``scontrol update`` field an intent is written as (and read back from): the one
# list of them, which the test that no other module spells one reads too.
UPDATE_FIELDS = frozenset(
    {
        "TimeLimit",
        "MinMemoryNode",
        "NumCPUs",
        "MinCPUsNode",
        "TresPerNode",
        "TresPerJob",
        "NumNodes",
        "Comment",
        "AdminComment",
        "Nice",
        "StartTime",
    }
)
# Audit keys of a resize (never sent to Slurm).
FROM_KEY, TO_KEY, TYPE_KEY, PREEMPT_KEY = "from_gpus", "to_gpus", "gpu_type", "preempt"


class UpdateFieldError(SlurmValueError):
    """An update field (or an intent) that has no counterpart on the other side."""


def gres_prefix(slurm_version: str) -> str:
    """Return how ``tres_per_*`` strings name a GRES: ``gres:`` before 23.02, else ``gres/``.

    An unknown version gets the current form.

    >>> gres_prefix("22.05.9"), gres_prefix("24.11.1"), gres_prefix("")
    ('gres:', 'gres/', 'gres/')
    """
    m = _VERSION_RE.match(slurm_version.strip())
    if m and (int(m.group(1)), int(m.group(2))) < (23, 2):
        return "gres:"
    return "gres/"


def spelt_alike(intents: Iterable[Intent]) -> bool:
    """Whether every release spells ``intents`` alike (no GRES among them), so a backend
    need not ask Slurm which release it runs to render them."""
    return not any(isinstance(i, SetGpus | NarrowToShards | NarrowToMps) for i in intents)


_LIMIT_TEXTS: dict[int | None, str] = {}


def _limit_text(seconds: int | None) -> str:
    """``format_time_limit``, memoised: a queue holds few distinct limits."""
    text = _LIMIT_TEXTS.get(seconds)
    if text is None:
        text = format_time_limit(SetTimeLimit(seconds).limit)
        if len(_LIMIT_TEXTS) < 4096:
            _LIMIT_TEXTS[seconds] = text
    return text


def _put(out: dict[str, str], intent: Intent, prefix: str) -> None:
    """Add the one ``scontrol update`` field of ``intent``."""
    if isinstance(intent, SetTimeLimit):
        out["TimeLimit"] = _limit_text(intent.seconds)
    elif isinstance(intent, SetMemoryPerNode):
        out["MinMemoryNode"] = str(intent.mib)
    elif isinstance(intent, SetGpus):
        gpu = f"{prefix}gpu:{intent.gpu_type}:" if intent.gpu_type else f"{prefix}gpu:"
        out["TresPerNode" if intent.per_node else "TresPerJob"] = f"{gpu}{intent.count}"
    elif isinstance(intent, SetCpus):
        out["NumCPUs"] = str(intent.count)
    elif isinstance(intent, SetCpusPerNode):
        out["MinCPUsNode"] = str(intent.count)
    elif isinstance(intent, NarrowToShards):
        out["TresPerNode"] = f"{prefix}shard:{intent.shards}"
    elif isinstance(intent, NarrowToMps):
        out["TresPerNode"] = f"{prefix}mps:{intent.share}"
    elif isinstance(intent, SetNice):
        out["Nice"] = str(intent.nice)
    elif isinstance(intent, SetComment):
        out["Comment"] = intent.text
    elif isinstance(intent, SetAdminComment):
        out["AdminComment"] = intent.text
    elif isinstance(intent, SetNodes):
        out["NumNodes"] = str(intent.count)
    elif isinstance(intent, StartSoon):
        out["StartTime"] = f"now+{intent.delay_s}"
    else:
        raise UpdateFieldError(f"{type(intent).__name__} is not an scontrol update field")


def update_fields(intents: Iterable[Intent], slurm_version: str) -> dict[str, str]:
    """The ``scontrol update`` fields that carry out ``intents`` on ``slurm_version``.

    In the intents' order; UpdateFieldError for a resize or preemption (a transaction,
    not an update).
    """
    prefix = gres_prefix(slurm_version)
    out: dict[str, str] = {}
    for intent in intents:
        _put(out, intent, prefix)
    return out


def field_name(intent: Intent) -> str:
    """The name of the ``scontrol update`` field that carries ``intent`` (alike in every
    release), e.g. for messages that say which change Slurm shows in place."""
    (key,) = update_fields((intent,), "")
    return key


def audit_fields(intents: Iterable[Intent], slurm_version: str) -> dict[str, str]:
    """What the audit records of an action's intents: the update fields, and a resize's
    ``from_gpus`` / ``to_gpus`` (``gpu_type``, ``preempt``) after them."""
    prefix = gres_prefix(slurm_version)
    out: dict[str, str] = {}
    sized: Resize | Preempt | None = None
    for intent in intents:
        if isinstance(intent, Resize | Preempt):
            sized = intent
        else:
            _put(out, intent, prefix)
    if isinstance(sized, Resize):
        if sized.gpu_type:
            out[TYPE_KEY] = sized.gpu_type
        out[FROM_KEY] = str(sized.from_gpus)
        out[TO_KEY] = str(sized.to_gpus)
    elif isinstance(sized, Preempt):
        out[FROM_KEY] = out[TO_KEY] = str(sized.gpus)
        out[PREEMPT_KEY] = "1"
    return out


def _int(key: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise UpdateFieldError(f"{key}={value!r}: not a whole number") from None


def _tres(key: str, value: str) -> Intent:
    items = parse_gres(value)
    if len(items) != 1:
        raise UpdateFieldError(f"{key}={value!r}: not one GRES")
    item = items[0]
    if item.name == "gpu":
        return SetGpus(item.count, item.type, per_node=key == "TresPerNode")
    if item.name == "shard" and key == "TresPerNode" and item.type is None:
        return NarrowToShards(item.count)
    if item.name == "mps" and key == "TresPerNode" and item.type is None:
        return NarrowToMps(item.count)
    raise UpdateFieldError(f"{key}={value!r}: not a GPU, shard or MPS request")


def _one(key: str, value: str) -> Intent:
    if key == "TimeLimit":
        return SetTimeLimit.of(parse_time_limit(value))
    if key == "MinMemoryNode":
        return SetMemoryPerNode(parse_memory_mib(value))
    if key == "NumCPUs":
        return SetCpus(_int(key, value))
    if key == "MinCPUsNode":
        return SetCpusPerNode(_int(key, value))
    if key in ("TresPerNode", "TresPerJob"):
        return _tres(key, value)
    if key == "Nice":
        return SetNice(_int(key, value))
    if key == "Comment":
        return SetComment(value)
    if key == "AdminComment":
        return SetAdminComment(value)
    if key == "NumNodes":
        return SetNodes(_int(key, value))
    if key == "StartTime":
        m = _START_RE.fullmatch(value.strip())
        if m is None:
            raise UpdateFieldError(f"StartTime={value!r}: not now+N")
        return StartSoon(int(m.group(1)))
    raise UpdateFieldError(f"unknown update field {key}={value!r}")


def parse_fields(
    fields: Mapping[str, str], *, strict: bool = True
) -> tuple[tuple[Intent, ...], dict[str, str]]:
    """Read update (or audit) fields back into intents, in the fields' order.

    Returns the intents and the fields that were left unread: none when ``strict``
    (SlurmValueError for the first field that is unknown or does not parse), else each
    such field with its reason (``actuate.confirm`` skips what it cannot judge).
    """
    intents: list[Intent] = []
    left: dict[str, str] = {}
    sizes = {k: fields[k] for k in (FROM_KEY, TO_KEY, TYPE_KEY, PREEMPT_KEY) if k in fields}
    for key, value in fields.items():
        if key in sizes:
            continue
        try:
            intents.append(_one(key, value))
        except SlurmValueError as exc:
            if strict:
                raise
            left[key] = str(exc)
    if sizes:
        try:
            frm, to = _int(FROM_KEY, sizes[FROM_KEY]), _int(TO_KEY, sizes[TO_KEY])
            if PREEMPT_KEY in sizes:
                if frm != to:
                    raise UpdateFieldError(f"a preemption of {frm} -> {to} GPUs")
                intents.append(Preempt(frm))
            else:
                intents.append(Resize(frm, to, sizes.get(TYPE_KEY) or None))
        except (KeyError, SlurmValueError) as exc:
            if strict:
                raise UpdateFieldError(f"resize fields {sizes}: {exc}") from None
            left.update(dict.fromkeys(sizes, str(exc)))
    return tuple(intents), left
