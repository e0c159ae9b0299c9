"""Email users about their jobs through SMTP, at most once per (user, alert) per window.

The daemon hands every Decision with ``notify`` set to ``Mailer.notify_all`` once per cycle.
Nothing here raises into the daemon for a mail problem: an unreachable relay, a refused
recipient or a broken template comes back as a ``failed`` outcome with one line saying why.
Problems with the configuration files (password, address map, template directory) raise
NotifyConfigError when the Mailer is built, which is when the daemon starts.

Rate limit. Every decision is a row in the ``notifications`` table. A user who was sent an
email for an alert within ``min_interval`` (7 days) before ``at`` gets no other one for
that alert; a different alert has its own window. ``alert_intervals`` overrides the window
per alert; ``"0s"`` sends every time (meant for alerts a policy raises once per job, like
"your job was cancelled", which a user must never miss). Failed attempts do not count, so the
next cycle tries again. In a dry run, dry-run rows count as well as sent ones, so the log
shows what a live run would really send, and turning the dry run off does not wait for a
window that nothing was sent in.

Several jobs, one email. When several of a user's jobs raise the same alert in the same
``notify_all`` call, the user gets one email: about the first of them (in the order
given), with the others listed (``other_jobs`` in the template). Each job gets its own row
with the same subject and outcome, so "was the owner of job J told?" has an answer.
Later jobs raising the alert within the window are rate-limited and recorded once per job
per window, so a policy that proposes the same warning every cycle does not grow the table.
"""

from __future__ import annotations

import enum
import logging
import re
import smtplib
import socket
import ssl
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid, parseaddr
from pathlib import Path

from sqlalchemy import Engine, and_, insert, select

from slurmgpu.notify.render import (
    AlertTemplates,
    JobFacts,
    NotifyTemplateError,
    RenderedMessage,
    alert_context,
    alert_key,
)
from slurmgpu.notify.settings import NotifyConfigError, NotifySettings, valid_address
from slurmgpu.policy.base import Action, Decision
from slurmgpu.store import schema

log = logging.getLogger("slurmgpu.notify")

ADMIN_REPORT_ALERT = "admin_report"
_USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


class NotifyStatus(enum.StrEnum):
    """What became of one email."""

    SENT = "sent"
    RATE_LIMITED = "rate_limited"
    DISABLED = "disabled"
    DRY_RUN = "dry_run"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class NotifyOutcome:
    """What became of the email for one (user, alert) group of jobs.

    ``reason`` is one line (empty when sent); ``job_ids`` are the jobs the email covers,
    the first being the one it is about.
    """

    status: NotifyStatus
    reason: str = ""
    recipient: str = ""
    subject: str = ""
    job_ids: tuple[int, ...] = ()

    @property
    def sent(self) -> bool:
        return self.status is NotifyStatus.SENT


def read_password_file(path: Path) -> str:
    """Return the first line of ``path``; NotifyConfigError unless only its owner can read it."""
    try:
        st = path.stat()
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise NotifyConfigError(
                "password_file",
                f"{path} can be read by others; make it private: chmod 600 {path}",
            )
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise NotifyConfigError("password_file", f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise NotifyConfigError("password_file", f"{path} is not UTF-8 text") from None
    password = lines[0].strip() if lines else ""
    if not password:
        raise NotifyConfigError("password_file", f"{path} is empty")
    return password


def read_address_map(path: Path) -> dict[str, str]:
    """Return user → address from ``user: address`` (or ``user address``) lines; ``#`` comments.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "map"
    >>> _ = p.write_text("alice: alice.smith@example.edu  # moved\\n")
    >>> read_address_map(p)
    {'alice': 'alice.smith@example.edu'}
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise NotifyConfigError("address_map_file", f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise NotifyConfigError("address_map_file", f"{path} is not UTF-8 text") from None
    addresses: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = re.split(r"\s*:\s*|\s+", line, maxsplit=1)
        if len(parts) != 2 or not parts[0] or not valid_address(parts[1]):
            raise NotifyConfigError(
                "address_map_file",
                f'{path}, line {number}: expected "user: address", not {raw.strip()!r}',
            )
        addresses[parts[0]] = parts[1]
    return addresses


def _smtp_problem(exc: BaseException, timeout_s: float) -> str:
    """Return one line for an SMTP or socket error."""
    detail: str
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        refused = [
            f"{rcpt} ({code} {_text(message)})" for rcpt, (code, message) in exc.recipients.items()
        ]
        detail = "the server refused " + ", ".join(refused)
    elif isinstance(exc, smtplib.SMTPAuthenticationError):
        detail = (
            f"login refused ({exc.smtp_code} {_text(exc.smtp_error)}); "
            "check notify.username and the password file"
        )
    elif isinstance(exc, smtplib.SMTPResponseException):
        detail = f"the server answered {exc.smtp_code} {_text(exc.smtp_error)}"
    elif isinstance(exc, smtplib.SMTPServerDisconnected):
        # smtplib reports a read timeout as a disconnection; the timeout is its context.
        if isinstance(exc.__context__, TimeoutError):
            detail = f"no answer within {timeout_s:g} s"
        else:
            detail = "the server closed the connection"
    elif isinstance(exc, smtplib.SMTPNotSupportedError):
        detail = f"the server does not support it: {exc}"
    elif isinstance(exc, ConnectionRefusedError):
        detail = "connection refused (is an SMTP server listening there?)"
    elif isinstance(exc, TimeoutError):
        detail = f"no answer within {timeout_s:g} s"
    elif isinstance(exc, socket.gaierror):
        detail = f"cannot resolve the host name ({exc.strerror})"
    elif isinstance(exc, ssl.SSLError):
        detail = f"TLS failed: {exc.reason or exc}"
    elif isinstance(exc, OSError) and exc.strerror:
        detail = exc.strerror
    else:
        detail = str(exc) or type(exc).__name__
    return " ".join(detail.split())


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class Mailer:
    """Sends alert emails and admin reports, keeping the rate limit in the store.

    ``cluster`` labels the rows (the same label as the daemon's JobStore) and selects which
    jobs' names and nodes the emails show.
    """

    def __init__(
        self, settings: NotifySettings, store_engine: Engine, *, cluster: str = ""
    ) -> None:
        settings.check()
        self.settings = settings
        self.engine = store_engine
        self.cluster = cluster
        template_dir = settings.template_dir
        if template_dir is not None and not template_dir.is_dir():
            raise NotifyConfigError("template_dir", f"{template_dir} is not a directory")
        self.templates = AlertTemplates(template_dir)
        self._password: str | None = None
        self._addresses: dict[str, str] = {}
        if settings.enabled:
            if settings.password_file is not None:
                self._password = read_password_file(settings.password_file)
            if settings.address_map_file is not None:
                self._addresses = read_address_map(settings.address_map_file)

    # -- public --------------------------------------------------------------

    def notify(self, action: Action, *, at: datetime) -> NotifyOutcome:
        """Email ``action.user`` about ``action`` unless rate-limited; never raises for mail."""
        return self.notify_all([action], at=at)[0]

    def notify_all(self, actions: Iterable[Action], *, at: datetime) -> list[NotifyOutcome]:
        """Return one outcome per (user, alert) group, in order: one email per group at most."""
        if at.tzinfo is None:
            raise ValueError("at must be timezone-aware")
        groups: dict[tuple[str, str], list[Action]] = {}
        for action in actions:
            group = groups.setdefault((action.user, alert_key(action)), [])
            if all(a.job_id != action.job_id for a in group):
                group.append(action)
        if not self.settings.enabled:
            return [
                NotifyOutcome(
                    NotifyStatus.DISABLED,
                    "notifications are off (notify.enabled = false)",
                    job_ids=tuple(a.job_id for a in group),
                )
                for group in groups.values()
            ]
        return [
            self._notify_group(user, alert, group, at) for (user, alert), group in groups.items()
        ]

    def notify_decisions(
        self, decisions: Iterable[Decision], *, at: datetime
    ) -> list[NotifyOutcome]:
        """``notify_all`` for the decisions whose ``notify`` is set (the engine's verdict)."""
        return self.notify_all([d.action for d in decisions if d.notify], at=at)

    def send_admin_report(self, subject: str, body: str, *, at: datetime) -> NotifyOutcome:
        """Email ``body`` to ``notify.admin_recipients`` (no rate limit); never raises for mail."""
        recipients = ", ".join(self.settings.admin_recipients)
        if not self.settings.enabled:
            return NotifyOutcome(
                NotifyStatus.DISABLED, "notifications are off (notify.enabled = false)"
            )
        if not recipients:
            return NotifyOutcome(NotifyStatus.DISABLED, "notify.admin_recipients is empty")
        subject = " ".join(subject.split())
        message = RenderedMessage(subject=subject, body=body, template="")
        outcome = self._deliver(recipients, message, ADMIN_REPORT_ALERT, (), at)
        self._record("", ADMIN_REPORT_ALERT, [None], at, subject, outcome.status)
        return outcome

    # -- one group -----------------------------------------------------------

    def _notify_group(
        self, user: str, alert: str, group: Sequence[Action], at: datetime
    ) -> NotifyOutcome:
        job_ids = tuple(a.job_id for a in group)
        recipient, why_not = self._address_for(user)
        if recipient is None:
            log.warning("notify: %s", why_not)
            self._record(user, alert, job_ids, at, "", NotifyStatus.FAILED)
            return NotifyOutcome(NotifyStatus.FAILED, why_not, job_ids=job_ids)
        last = self._last_counted(user, alert, at)
        if last is not None:
            self._record_rate_limited(user, alert, job_ids, at)
            until = last + self.settings.interval_for(alert)
            return NotifyOutcome(
                NotifyStatus.RATE_LIMITED,
                f"{user} was already emailed about {alert} at {last:%Y-%m-%d %H:%M %Z}; "
                f"the next email can go after {until:%Y-%m-%d %H:%M %Z}",
                recipient=recipient,
                job_ids=job_ids,
            )
        facts = self._job_facts(job_ids)
        primary, others = group[0], group[1:]
        context = alert_context(
            primary,
            at=at,
            job=facts.get(primary.job_id),
            others=[(o, facts.get(o.job_id)) for o in others],
            cluster=self.cluster,
            contact=self.settings.contact,
            repeat_after=self.settings.interval_for(alert),
        )
        try:
            message = self.templates.render(alert, context)
        except NotifyTemplateError as exc:
            log.error("notify: cannot write the email to %s: %s", recipient, exc)
            self._record(user, alert, job_ids, at, "", NotifyStatus.FAILED)
            return NotifyOutcome(
                NotifyStatus.FAILED, str(exc), recipient=recipient, job_ids=job_ids
            )
        outcome = self._deliver(recipient, message, alert, job_ids, at)
        self._record(user, alert, job_ids, at, message.subject, outcome.status)
        return outcome

    def _deliver(
        self,
        recipient: str,
        message: RenderedMessage,
        alert: str,
        job_ids: tuple[int, ...],
        at: datetime,
    ) -> NotifyOutcome:
        """Send (or, in a dry run, log) one message; return what happened."""
        if self.settings.dry_run:
            log.info("notify dry run: would send %r to %s", message.subject, recipient)
            return NotifyOutcome(
                NotifyStatus.DRY_RUN,
                "dry run: nothing was sent",
                recipient=recipient,
                subject=message.subject,
                job_ids=job_ids,
            )
        email = self._email(recipient, message, alert, job_ids, at)
        problem = self._send(email)
        if problem is not None:
            reason = (
                f"cannot send to {recipient} via "
                f"{self.settings.smtp_host}:{self.settings.smtp_port}: {problem}"
            )
            log.warning("notify: %s", reason)
            return NotifyOutcome(
                NotifyStatus.FAILED,
                reason,
                recipient=recipient,
                subject=message.subject,
                job_ids=job_ids,
            )
        log.info("notify: sent %r to %s", message.subject, recipient)
        return NotifyOutcome(
            NotifyStatus.SENT, recipient=recipient, subject=message.subject, job_ids=job_ids
        )

    def _email(
        self,
        recipient: str,
        message: RenderedMessage,
        alert: str,
        job_ids: tuple[int, ...],
        at: datetime,
    ) -> EmailMessage:
        email = EmailMessage()
        email["Subject"] = message.subject
        email["From"] = self.settings.sender
        email["To"] = recipient
        email["Date"] = format_datetime(at)
        # An explicit domain: make_msgid's default asks DNS for this host's FQDN.
        sender_domain = parseaddr(self.settings.sender)[1].rpartition("@")[2] or "localhost"
        email["Message-ID"] = make_msgid(domain=sender_domain)
        email["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation auto-replies
        email["X-Slurmgpu-Alert"] = alert
        if job_ids:
            email["X-Slurmgpu-Jobs"] = " ".join(str(j) for j in job_ids)
        email.set_content(message.body)
        return email

    def _send(self, email: EmailMessage) -> str | None:
        """Return None once the relay accepted ``email``, else one line saying why not."""
        s = self.settings
        timeout_s = s.timeout.total_seconds()
        try:
            with smtplib.SMTP(s.smtp_host, s.smtp_port, timeout=timeout_s) as smtp:
                if s.starttls:
                    smtp.starttls(context=ssl.create_default_context())
                if s.username is not None and self._password is not None:
                    smtp.login(s.username, self._password)
                smtp.send_message(email)
        except (smtplib.SMTPException, OSError) as exc:
            return _smtp_problem(exc, timeout_s)
        return None

    # -- addresses and jobs --------------------------------------------------

    def _address_for(self, user: str) -> tuple[str | None, str]:
        """Return (address, "") or (None, why there is none)."""
        mapped = self._addresses.get(user)
        if mapped is not None:
            return mapped, ""
        domain = self.settings.domain
        if domain is None:
            where = self.settings.address_map_file
            return None, f"no email address for user {user!r}: add it to {where}"
        if not _USER_NAME.fullmatch(user):
            return None, f"user name {user!r} cannot be used as an email address"
        return f"{user}@{domain}", ""

    def _job_facts(self, job_ids: Sequence[int]) -> dict[int, JobFacts]:
        """Return what the store knows of each job (its newest incarnation)."""
        j = schema.jobs
        stmt = (
            select(
                j.c.job_id,
                j.c.name,
                j.c.nodes,
                j.c.partition,
                j.c.account,
                j.c.gpus,
                j.c.time_limit_s,
                j.c.memory_mib,
            )
            .where(and_(j.c.cluster == self.cluster, j.c.job_id.in_(list(job_ids))))
            .order_by(j.c.id)
        )
        facts: dict[int, JobFacts] = {}
        with self.engine.connect() as conn:
            for row in conn.execute(stmt):
                facts[int(row.job_id)] = JobFacts(
                    job_id=int(row.job_id),
                    name=row.name or "",
                    nodes=row.nodes or "",
                    partition=row.partition or "",
                    account=row.account or "",
                    gpus=row.gpus,
                    time_limit_s=row.time_limit_s,
                    memory_mib=row.memory_mib,
                )
        return facts

    # -- the notifications table --------------------------------------------

    def _counted_outcomes(self) -> list[str]:
        if self.settings.dry_run:
            return [NotifyStatus.SENT.value, NotifyStatus.DRY_RUN.value]
        return [NotifyStatus.SENT.value]

    def _last_counted(self, user: str, alert: str, at: datetime) -> datetime | None:
        """Return when ``user`` was last emailed about ``alert`` within the window, if ever."""
        n = schema.notifications
        stmt = (
            select(n.c.sent_at)
            .where(
                and_(
                    n.c.cluster == self.cluster,
                    n.c.user == user,
                    n.c.alert == alert,
                    n.c.outcome.in_(self._counted_outcomes()),
                    n.c.sent_at > at - self.settings.interval_for(alert),
                )
            )
            .order_by(n.c.sent_at.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
            last: datetime | None = conn.execute(stmt).scalar()
        return last

    def _record_rate_limited(
        self, user: str, alert: str, job_ids: Sequence[int], at: datetime
    ) -> None:
        """Record each job once per window (not once per cycle)."""
        n = schema.notifications
        stmt = select(n.c.job_id).where(
            and_(
                n.c.cluster == self.cluster,
                n.c.user == user,
                n.c.alert == alert,
                n.c.outcome != NotifyStatus.FAILED.value,
                n.c.job_id.in_(list(job_ids)),
                n.c.sent_at > at - self.settings.interval_for(alert),
            )
        )
        with self.engine.connect() as conn:
            seen = {int(j) for j in conn.execute(stmt).scalars() if j is not None}
        fresh = [j for j in job_ids if j not in seen]
        if fresh:
            self._record(user, alert, fresh, at, "", NotifyStatus.RATE_LIMITED)

    def _record(
        self,
        user: str,
        alert: str,
        job_ids: Sequence[int | None],
        at: datetime,
        subject: str,
        outcome: NotifyStatus,
    ) -> None:
        rows = [
            {
                "cluster": self.cluster,
                "user": user,
                "alert": alert,
                "job_id": job_id,
                "sent_at": at,
                "subject": subject,
                "outcome": outcome.value,
            }
            for job_id in job_ids
        ]
        with self.engine.begin() as conn:
            conn.execute(insert(schema.notifications), rows)
