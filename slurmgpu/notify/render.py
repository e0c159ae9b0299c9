"""Alert emails from Jinja2 templates: the context a template sees, and the rendered message.

A template is plain text (no HTML escaping) whose first line is ``Subject: ...``; the rest is
the body. It is looked up by the action's alert name (``idle_gpu_warning`` →
``idle_gpu_warning.txt``), first in the site's ``notify.template_dir``, then among the
templates shipped in ``slurmgpu/notify/templates/``; an alert without a template gets
``generic.txt``. Names starting with ``_`` are partials (``_other_jobs.txt``,
``_footer.txt``) that templates include; sites may override those too.

Templates are rendered with ``StrictUndefined``: a variable the template needs but the
context lacks is an error, never an empty string in someone's inbox.

Variables every template sees:

- ``user``, ``cluster``, ``job_id``, ``policy``, ``kind``, ``reason``, ``alert``: from the
  Action (``alert`` is the rate-limit key).
- ``job``: what the store knows of the job (``job.id``, ``job.name``, ``job.nodes`` — a
  Slurm node list —, ``job.partition``, ``job.account``, ``job.gpus``, ``job.time_limit_s``,
  ``job.memory_mib``); the strings are empty and the numbers None when the job is unknown.
- ``numbers``: the Action's numbers, as given (None values included).
- every key of ``numbers`` whose value is not None, at top level (``idle_minutes``), unless
  it collides with one of the names in this list, which win.
- ``at``: when the cycle ran (aware datetime); ``contact``: whom to ask for an exemption;
  ``repeat_after``: the rate-limit window in words (``"7 days"``; empty when there is none).
- ``other_jobs``: the user's other jobs that raised the same alert in the same cycle (they
  share this one email), each with ``job_id``, ``job``, ``reason`` and ``numbers``.

Filters: ``minutes`` (``135`` → ``"2 h 15 min"``), ``slurm_time`` (seconds →
``"01:30:00"`` / ``"2-00:00:00"``), ``slurm_mem`` (MiB → ``"10G"`` / ``"9984M"``, exact),
``sbatch_time``, ``sbatch_mem``, ``sbatch_gpus`` (the same numbers as the options to ask
for: ``"--time=01:30:00"``, ``"--mem=10G"``, ``"--gpus=2"``, spelt by
:mod:`slurmgpu.slurm.sbatch`), ``plus_minutes`` (datetime + minutes), ``clock`` (datetime
→ local ``"2025-03-01 14:30 CET"``).

The numbers each shipped template expects from the policy are in ``REQUIRED_NUMBERS`` and
``OPTIONAL_NUMBERS``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import jinja2

from slurmgpu.plaintext import template_finalize
from slurmgpu.policy.base import Action
from slurmgpu.policy.sizing import ceil_whole
from slurmgpu.slurm import sbatch
from slurmgpu.units import format_time_limit

GENERIC_TEMPLATE = "generic"

#: Numbers each shipped template cannot render without (``Action.numbers`` keys).
REQUIRED_NUMBERS: Mapping[str, tuple[str, ...]] = {
    "idle_gpu_warning": (
        "idle_minutes",  # how long the GPUs have been idle
        "gpus_idle",  # how many of the job's GPUs are idle
        "gpus_allocated",  # how many GPUs the job holds
        "act_after_minutes",  # idle minutes after which the action is taken
        "action",  # "requeue", "cancel" or "notify" (nothing is done)
    ),
    "idle_gpu_action": (
        "idle_minutes",  # how long the GPUs were idle when the job was acted on
        "action",  # "requeue" or "cancel"
    ),
    "rightsize_advice": (),
    GENERIC_TEMPLATE: (),
}

#: Numbers a shipped template uses when present (any subset, including none).
ENERGY_NUMBERS = ("energy_kwh", "energy_idle_pct", "energy_method")  # _energy.txt; the daemon

OPTIONAL_NUMBERS: Mapping[str, tuple[str, ...]] = {
    "idle_gpu_warning": ENERGY_NUMBERS,
    "idle_gpu_action": ENERGY_NUMBERS,
    "rightsize_advice": (
        *ENERGY_NUMBERS,
        "time_limit_s",  # the job's --time, seconds
        "proposed_time_limit_s",
        "memory_mib",  # the job's --mem, MiB
        "proposed_memory_mib",
        "gpus",  # GPUs the job asked for
        "proposed_gpus",
    ),
    GENERIC_TEMPLATE: ENERGY_NUMBERS,
}

_ALERT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_MAX_SUBJECT = 200


class NotifyTemplateError(Exception):
    """A template is missing, malformed or needs a variable the context lacks; one line."""


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the store knows of a job, for the email (empty/None where it knows nothing)."""

    job_id: int
    name: str = ""
    nodes: str = ""
    partition: str = ""
    account: str = ""
    gpus: int | None = None
    time_limit_s: int | None = None
    memory_mib: int | None = None

    def as_context(self) -> dict[str, Any]:
        return {
            "id": self.job_id,
            "name": self.name,
            "nodes": self.nodes,
            "partition": self.partition,
            "account": self.account,
            "gpus": self.gpus,
            "time_limit_s": self.time_limit_s,
            "memory_mib": self.memory_mib,
        }


@dataclass(frozen=True, slots=True)
class RenderedMessage:
    """A rendered email: one-line subject, plain-text body, and the template it came from."""

    subject: str
    body: str
    template: str


# The alerts the policies raise → the shipped template that words them.
ALERT_FAMILIES: dict[str, str] = {
    "idle_gpu_warning_1": "idle_gpu_warning",
    "idle_gpu_warning_2": "idle_gpu_warning",
    "idle_gpu_sliding_warning": "idle_gpu_warning",
    "idle_gpu_requeue": "idle_gpu_action",
    "idle_gpu_cancel": "idle_gpu_action",
    "idle_gpu_notice": "idle_gpu_action",
    "rightsize": "rightsize_advice",
}


def alert_key(action: Action) -> str:
    """Return the rate-limit key of ``action``: its alert name, else ``policy.kind``."""
    return (action.alert or f"{action.policy}.{action.kind}")[:64]


def alert_context(
    action: Action,
    *,
    at: datetime,
    job: JobFacts | None = None,
    others: Sequence[tuple[Action, JobFacts | None]] = (),
    cluster: str = "",
    contact: str = "",
    repeat_after: timedelta = timedelta(days=7),
) -> dict[str, Any]:
    """Return the variables a template sees for ``action`` (see the module docstring)."""
    context: dict[str, Any] = {k: v for k, v in action.numbers.items() if v is not None}
    context.update(
        {
            "user": action.user,
            "cluster": cluster,
            "job_id": action.job_id,
            "policy": action.policy,
            "kind": action.kind,
            "reason": action.reason,
            "alert": alert_key(action),
            "job": (job or JobFacts(action.job_id)).as_context(),
            "numbers": dict(action.numbers),
            "at": at,
            "contact": contact or "your cluster administrators",
            "repeat_after": _interval_text(repeat_after),
            "other_jobs": [
                {
                    "job_id": other.job_id,
                    "job": (facts or JobFacts(other.job_id)).as_context(),
                    "reason": other.reason,
                    "numbers": dict(other.numbers),
                }
                for other, facts in others
            ],
        }
    )
    return context


def minutes_text(value: float) -> str:
    """Return ``value`` minutes in words: ``135`` → ``"2 h 15 min"``, ``2880`` → ``"2 d"``."""
    total = max(0, round(float(value)))
    days, rest = divmod(total, 1440)
    hours, mins = divmod(rest, 60)
    parts = [f"{days} d"] if days else []
    if hours:
        parts.append(f"{hours} h")
    if mins or not parts:
        parts.append(f"{mins} min")
    return " ".join(parts)


def _limit(seconds: float) -> timedelta:
    # whole seconds, rounded up (a limit is never shortened); a number below 0 is none
    return timedelta(seconds=max(0, math.ceil(float(seconds))))


def _mib(mib: float) -> int:
    # whole MiB, rounded up (float noise aside), at least 1
    return max(1, ceil_whole(float(mib)))


def slurm_time(seconds: float) -> str:
    """Return a Slurm ``--time`` value (:func:`slurmgpu.units.format_time_limit`):
    ``5400`` → ``"01:30:00"``, ``172800`` → ``"2-00:00:00"``."""
    return format_time_limit(_limit(seconds))


def slurm_mem(mib: float) -> str:
    """Return a Slurm ``--mem`` value, exact (:func:`slurmgpu.slurm.sbatch.mem_size`):
    ``10240`` → ``"10G"``, ``9984`` → ``"9984M"``: the figure rightsizing set, not a
    rounder one."""
    return sbatch.mem_size(_mib(mib))


def sbatch_time(seconds: float) -> str:
    """The option asking for a time limit of ``seconds``: ``5400`` → ``"--time=01:30:00"``."""
    return str(sbatch.time_limit(_limit(seconds)))


def sbatch_mem(mib: float) -> str:
    """The option asking for ``mib`` MiB per node: ``10240`` → ``"--mem=10G"``."""
    return str(sbatch.mem(_mib(mib)))


def sbatch_gpus(count: float) -> str:
    """The option asking for ``count`` GPUs: ``2`` → ``"--gpus=2"`` (a count that is not
    whole is a ValueError, not an option sbatch refuses)."""
    number = float(count)
    if not number.is_integer():
        raise ValueError(f"{count!r} is not a whole number of GPUs")
    return str(sbatch.gpus(int(number)))


def _interval_text(interval: timedelta) -> str:
    seconds = round(interval.total_seconds())
    if seconds <= 0:
        return ""
    if seconds and seconds % 86400 == 0:
        days = seconds // 86400
        return "day" if days == 1 else f"{days} days"
    return minutes_text(seconds / 60)


def _plus_minutes(at: datetime, minutes: float) -> datetime:
    return at + timedelta(minutes=float(minutes))


def _clock(at: datetime) -> str:
    # The daemon runs at the site, so the host's zone is the users' zone.
    return at.astimezone().strftime("%Y-%m-%d %H:%M %Z")


class AlertTemplates:
    """The alert templates: the site's directory first (if any), then the shipped ones."""

    def __init__(self, site_dir: Path | None = None) -> None:
        loaders: list[jinja2.BaseLoader] = []
        if site_dir is not None:
            loaders.append(jinja2.FileSystemLoader(str(site_dir)))
        loaders.append(jinja2.PackageLoader("slurmgpu.notify", "templates"))
        # Plain-text email: HTML escaping would turn "<" in a job name into "&lt;".
        self.env = jinja2.Environment(
            loader=jinja2.ChoiceLoader(loaders),
            undefined=jinja2.StrictUndefined,
            autoescape=False,  # noqa: S701
            # Job names are the user's: a newline must not forge a header, an escape
            # sequence must not reach a mail reader's terminal.
            finalize=template_finalize,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
        )
        self.env.filters.update(
            minutes=minutes_text,
            slurm_time=slurm_time,
            slurm_mem=slurm_mem,
            sbatch_time=sbatch_time,
            sbatch_mem=sbatch_mem,
            sbatch_gpus=sbatch_gpus,
            plus_minutes=_plus_minutes,
            clock=_clock,
        )

    def template_for(self, alert: str) -> str:
        """Return the template file that renders ``alert`` (``generic.txt`` if it has none).

        A site template named after the exact alert wins; then the shipped template of the
        alert's family (``idle_gpu_warning_2`` → ``idle_gpu_warning``)."""
        candidates = [alert, ALERT_FAMILIES.get(alert, "")] if alert else []
        for candidate in candidates:
            if not candidate or not _ALERT_NAME.fullmatch(candidate):
                continue
            name = f"{candidate}.txt"
            try:
                self.env.get_template(name)
            except jinja2.TemplateNotFound:
                continue
            except jinja2.TemplateSyntaxError as exc:
                raise NotifyTemplateError(_describe(name, exc)) from None
            return name
        return f"{GENERIC_TEMPLATE}.txt"

    def render(self, alert: str, context: Mapping[str, Any]) -> RenderedMessage:
        """Return the message for ``alert``, or raise NotifyTemplateError (one line)."""
        name = self.template_for(alert)
        try:
            text = self.env.get_template(name).render(context)
        except jinja2.TemplateError as exc:
            raise NotifyTemplateError(_describe(name, exc)) from None
        except (TypeError, ValueError, ArithmeticError) as exc:
            # e.g. a number given as text and then subtracted in the template
            raise NotifyTemplateError(f"template {name}: {type(exc).__name__}: {exc}") from None
        return _split(name, text)


def _describe(name: str, exc: jinja2.TemplateError) -> str:
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"template {exc.filename or name}, line {exc.lineno}: {exc.message}"
    if isinstance(exc, jinja2.TemplateNotFound):
        return f"template {name} includes {exc.name}, which does not exist"
    return f"template {name}: {exc.message or type(exc).__name__}"


def _split(name: str, text: str) -> RenderedMessage:
    first, _, body = text.lstrip().partition("\n")
    if not first.startswith("Subject:"):
        raise NotifyTemplateError(f'template {name}: the first line must be "Subject: ..."')
    subject = " ".join(first.removeprefix("Subject:").split())
    if not subject:
        raise NotifyTemplateError(f"template {name}: the subject is empty")
    if len(subject) > _MAX_SUBJECT:
        subject = subject[: _MAX_SUBJECT - 1].rstrip() + "…"
    body = re.sub(r"\n{3,}", "\n\n", body.strip("\n")).rstrip() + "\n"
    return RenderedMessage(subject=subject, body=body, template=name)
