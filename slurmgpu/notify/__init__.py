"""Email notifications: tell users about idle GPUs and over-asked jobs, at most once a week.

``Mailer(settings, engine).notify_all(actions, at=...)`` renders each alert from a Jinja2
template (``render``), rate-limits per (user, alert) in the ``notifications`` table and
sends through an SMTP relay (``mailer``). ``NotifySettings.from_mapping`` reads ``[notify]``.
"""

from __future__ import annotations

from slurmgpu.notify.mailer import Mailer, NotifyOutcome, NotifyStatus
from slurmgpu.notify.render import (
    OPTIONAL_NUMBERS,
    REQUIRED_NUMBERS,
    AlertTemplates,
    JobFacts,
    NotifyTemplateError,
    RenderedMessage,
    alert_context,
    alert_key,
)
from slurmgpu.notify.settings import NotifyConfigError, NotifySettings

__all__ = [
    "OPTIONAL_NUMBERS",
    "REQUIRED_NUMBERS",
    "AlertTemplates",
    "JobFacts",
    "Mailer",
    "NotifyConfigError",
    "NotifyOutcome",
    "NotifySettings",
    "NotifyStatus",
    "NotifyTemplateError",
    "RenderedMessage",
    "alert_context",
    "alert_key",
]
