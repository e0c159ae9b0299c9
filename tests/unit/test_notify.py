"""Email notifications against a real SMTP server (aiosmtpd on 127.0.0.1, a free port)."""

from __future__ import annotations

import email
import email.policy
import itertools
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from sqlalchemy import Engine, insert, select

from slurmgpu.notify import (
    OPTIONAL_NUMBERS,
    REQUIRED_NUMBERS,
    AlertTemplates,
    JobFacts,
    Mailer,
    NotifyConfigError,
    NotifySettings,
    NotifyStatus,
    NotifyTemplateError,
    alert_context,
)
from slurmgpu.policy.base import Action, Decision, Mode
from slurmgpu.store import create_store_engine, schema, upgrade

T0 = datetime(2025, 3, 3, 9, 0, tzinfo=UTC)
TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "slurmgpu" / "notify" / "templates"

IDLE_NUMBERS: dict[str, float | int | str | None] = {
    "idle_minutes": 65.0,
    "gpus_idle": 4,
    "gpus_allocated": 4,
    "act_after_minutes": 120,
    "action": "requeue",
}
ENERGY: dict[str, float | int | str | None] = {
    "energy_kwh": 41.0,
    "energy_idle_pct": 60,
    "energy_method": "NVML energy counter",
}
DOCUMENTED_NUMBERS: dict[str, dict[str, float | int | str | None]] = {
    "idle_gpu_warning": {**IDLE_NUMBERS, **ENERGY},
    "idle_gpu_action": {"idle_minutes": 125.0, "action": "cancel", **ENERGY},
    "rightsize_advice": {
        **ENERGY,
        "time_limit_s": 86400,
        "proposed_time_limit_s": 5400,
        "memory_mib": 262144,
        "proposed_memory_mib": 9800,
        "gpus": 4,
        "proposed_gpus": 1,
    },
    "generic": dict(ENERGY),
}


# -- a real SMTP server ------------------------------------------------------


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage


@dataclass
class CapturingHandler:
    """aiosmtpd handler: keeps every message; refuses recipients listed in ``refuse``."""

    received: list[Received] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if address in self.refuse:
            return "550 5.1.1 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.original_content or b""
        message = email.message_from_bytes(content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        self.received.append(Received(envelope.mail_from or "", list(envelope.rcpt_tos), message))
        return "250 OK: queued"


@dataclass
class SmtpServer:
    handler: CapturingHandler
    port: int
    logins: list[tuple[str, str]]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start(handler: CapturingHandler, **smtp_kwargs: Any) -> tuple[Controller, int]:
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port, **smtp_kwargs)
    controller.start()
    return controller, port


@pytest.fixture
def smtp_server() -> Iterator[SmtpServer]:
    handler = CapturingHandler()
    controller, port = _start(handler)
    try:
        yield SmtpServer(handler, port, [])
    finally:
        controller.stop()


@pytest.fixture
def smtp_server_with_login() -> Iterator[SmtpServer]:
    """A server that accepts AUTH LOGIN/PLAIN without TLS (loopback only) for slurmgpu/s3cret."""
    handler = CapturingHandler()
    logins: list[tuple[str, str]] = []

    def authenticator(
        server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth_data: Any
    ) -> AuthResult:
        assert isinstance(auth_data, LoginPassword)
        login, password = auth_data.login.decode(), auth_data.password.decode()
        logins.append((login, password))
        return AuthResult(success=(login, password) == ("slurmgpu", "s3cret"))

    controller, port = _start(handler, authenticator=authenticator, auth_require_tls=False)
    try:
        yield SmtpServer(handler, port, logins)
    finally:
        controller.stop()


# -- store and helpers -------------------------------------------------------


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    engine = create_store_engine(f"sqlite:///{tmp_path / 'state.db'}")
    upgrade(engine)
    store_job(engine, 4242, name="train-llm", nodes="gpu[1-2]", gpus=4)
    return engine


def store_job(engine: Engine, job_id: int, *, name: str, nodes: str, gpus: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            insert(schema.jobs),
            {
                "cluster": "della",
                "job_id": job_id,
                "name": name,
                "user": "alice",
                "state": "RUNNING",
                "nodes": nodes,
                "gpus": gpus,
                "first_seen": T0,
                "last_seen": T0,
                "updated_at": T0,
            },
        )


def settings_for(port: int, **changes: Any) -> NotifySettings:
    base = NotifySettings(
        enabled=True,
        smtp_host="127.0.0.1",
        smtp_port=port,
        sender="slurmgpu@della.example.edu",
        domain="example.edu",
        timeout=timedelta(seconds=5),
    )
    return replace(base, **changes)


def idle_warning(job_id: int = 4242, user: str = "alice", **numbers: Any) -> Action:
    return Action(
        policy="idle_gpu",
        kind="warn",
        job_id=job_id,
        user=user,
        reason=f"all 4 GPUs idle for {numbers.get('idle_minutes', 65):g} min",
        numbers={**IDLE_NUMBERS, **numbers},
        alert="idle_gpu_warning",
    )


def rightsize(job_id: int = 4242, user: str = "alice") -> Action:
    return Action(
        policy="rightsize",
        kind="warn",
        job_id=job_id,
        user=user,
        reason="used 9 % of the time limit",
        numbers={"time_limit_s": 86400, "proposed_time_limit_s": 7200},
        alert="rightsize_advice",
    )


def notification_rows(engine: Engine) -> list[tuple[str, str, int | None, str]]:
    n = schema.notifications
    with engine.connect() as conn:
        rows = conn.execute(
            select(n.c.user, n.c.alert, n.c.job_id, n.c.outcome).order_by(n.c.id)
        ).all()
    return [(r.user, r.alert, r.job_id, r.outcome) for r in rows]


# -- delivery and the rate limit ---------------------------------------------


def test_idle_warning_is_delivered_to_the_user_with_job_idle_time_and_next_step(
    smtp_server: SmtpServer, engine: Engine
) -> None:
    mailer = Mailer(settings_for(smtp_server.port), engine, cluster="della")

    outcome = mailer.notify(idle_warning(), at=T0)

    assert outcome.status is NotifyStatus.SENT, outcome.reason
    assert outcome.recipient == "alice@example.edu"
    [got] = smtp_server.handler.received
    assert got.rcpt_tos == ["alice@example.edu"]
    assert got.mail_from == "slurmgpu@della.example.edu"
    msg = got.message
    assert msg["Subject"] == "[slurmgpu] Job 4242 (train-llm): 4 of 4 GPUs idle for 1 h 5 min"
    assert msg["To"] == "alice@example.edu"
    assert msg["Auto-Submitted"] == "auto-generated"
    body = msg.get_content()
    assert "4242" in body
    assert "gpu[1-2]" in body
    assert "Idle for:   1 h 5 min" in body
    # what happens next, and when: requeued at 120 idle minutes, i.e. 55 minutes from now
    assert "will be requeued" in body
    assert "in about 55 min" in body
    assert "scancel 4242" in body  # how to avoid it
    assert "exemption" in body
    assert notification_rows(engine) == [("alice", "idle_gpu_warning", 4242, "sent")]


def test_second_warning_within_seven_days_is_rate_limited_and_recorded(
    smtp_server: SmtpServer, engine: Engine
) -> None:
    mailer = Mailer(settings_for(smtp_server.port), engine, cluster="della")
    assert mailer.notify(idle_warning(), at=T0).sent

    later = mailer.notify(idle_warning(job_id=4243), at=T0 + timedelta(days=6, hours=23))

    assert later.status is NotifyStatus.RATE_LIMITED
    assert "already emailed" in later.reason
    assert len(smtp_server.handler.received) == 1
    assert notification_rows(engine)[-1] == ("alice", "idle_gpu_warning", 4243, "rate_limited")


def test_a_different_alert_is_not_rate_limited_by_the_first(
    smtp_server: SmtpServer, engine: Engine
) -> None:
    mailer = Mailer(settings_for(smtp_server.port), engine, cluster="della")
    assert mailer.notify(idle_warning(), at=T0).sent

    other = mailer.notify(rightsize(), at=T0 + timedelta(minutes=1))

    assert other.status is NotifyStatus.SENT, other.reason
    subjects = [r.message["Subject"] for r in smtp_server.handler.received]
    assert len(subjects) == 2
    assert "--time=02:00:00" in subjects[1]


def test_another_user_is_not_rate_limited_by_the_first(
    smtp_server: SmtpServer, engine: Engine
) -> None:
    mailer = Mailer(settings_for(smtp_server.port), engine, cluster="della")
    assert mailer.notify(idle_warning(), at=T0).sent
    assert mailer.notify(idle_warning(job_id=77, user="bob"), at=T0).sent
    assert [r.rcpt_tos for r in smtp_server.handler.received] == [
        ["alice@example.edu"],
        ["bob@example.edu"],
    ]


def test_after_the_window_the_user_is_warned_again(smtp_server: SmtpServer, engine: Engine) -> None:
    mailer = Mailer(settings_for(smtp_server.port), engine, cluster="della")
    assert mailer.notify(idle_warning(), at=T0).sent
    assert not mailer.notify(idle_warning(), at=T0 + timedelta(days=3)).sent

    again = mailer.notify(idle_warning(), at=T0 + timedelta(days=7, seconds=1))

    assert again.status is NotifyStatus.SENT, again.reason
    assert len(smtp_server.handler.received) == 2


def test_an_alert_with_a_zero_window_is_sent_every_time(
    smtp_server: SmtpServer, engine: Engine
) -> None:
    cancelled = msgspec.structs.replace(
        idle_warning(),
        kind="cancel",
        alert="idle_gpu_action",
        numbers={"idle_minutes": 125, "action": "cancel"},
    )
    settings = settings_for(smtp_server.port, alert_intervals=(("idle_gpu_action", timedelta(0)),))
    mailer = Mailer(settings, engine, cluster="della")

    first = mailer.notify(cancelled, at=T0)
    second = mailer.notify(
        msgspec.structs.replace(cancelled, job_id=4243), at=T0 + timedelta(hours=1)
    )
    warning = mailer.notify(idle_warning(), at=T0)

    assert [first.status, second.status, warning.status] == [NotifyStatus.SENT] * 3
    assert not mailer.notify(idle_warning(), at=T0 + timedelta(hours=1)).sent  # still 7 days
    body = smtp_server.handler.received[0].message.get_content()
    assert "was cancelled" in smtp_server.handler.received[0].message["Subject"]
    assert "at most one email" not in body


def test_several_jobs_of_one_user_in_one_cycle_share_one_email(
    smtp_server: SmtpServer, engine: Engine
) -> None:
    store_job(engine, 4250, name="eval", nodes="gpu3", gpus=2)
    mailer = Mailer(settings_for(smtp_server.port), engine, cluster="della")

    outcomes = mailer.notify_all(
        [idle_warning(4242), idle_warning(4250), idle_warning(4242), rightsize(4250)], at=T0
    )

    assert [o.status for o in outcomes] == [NotifyStatus.SENT, NotifyStatus.SENT]
    assert outcomes[0].job_ids == (4242, 4250)
    assert len(smtp_server.handler.received) == 2  # one idle warning, one rightsizing advice
    body = smtp_server.handler.received[0].message.get_content()
    assert "Job:        4242 (train-llm)" in body
    assert "job 4250 (eval) on gpu3" in body
    assert notification_rows(engine) == [
        ("alice", "idle_gpu_warning", 4242, "sent"),
        ("alice", "idle_gpu_warning", 4250, "sent"),
        ("alice", "rightsize_advice", 4250, "sent"),
    ]


def test_only_decisions_the_engine_marked_notify_are_emailed(
    smtp_server: SmtpServer, engine: Engine
) -> None:
    mailer = Mailer(settings_for(smtp_server.port), engine, cluster="della")
    decisions = [
        Decision(idle_warning(4242), Mode.OBSERVE, execute=False, notify=False),
        Decision(rightsize(4242), Mode.ADVISE, execute=False, notify=True),
    ]

    outcomes = mailer.notify_decisions(decisions, at=T0)

    assert [o.job_ids for o in outcomes] == [(4242,)]
    assert [r.message["X-Slurmgpu-Alert"] for r in smtp_server.handler.received] == [
        "rightsize_advice"
    ]


def test_a_job_warned_every_cycle_is_recorded_once_per_window(
    smtp_server: SmtpServer, engine: Engine
) -> None:
    mailer = Mailer(settings_for(smtp_server.port), engine, cluster="della")
    for minute in range(0, 10):
        mailer.notify_all(
            [idle_warning(4242), idle_warning(4243)], at=T0 + timedelta(minutes=minute)
        )

    assert len(smtp_server.handler.received) == 1
    assert notification_rows(engine) == [
        ("alice", "idle_gpu_warning", 4242, "sent"),
        ("alice", "idle_gpu_warning", 4243, "sent"),
    ]


# -- failures ----------------------------------------------------------------


def test_smtp_server_down_is_a_failed_outcome_with_one_line_and_no_exception(
    engine: Engine,
) -> None:
    port = free_port()  # nothing listens here
    mailer = Mailer(settings_for(port), engine, cluster="della")

    outcome = mailer.notify(idle_warning(), at=T0)

    assert outcome.status is NotifyStatus.FAILED
    assert "\n" not in outcome.reason
    assert outcome.reason.startswith(f"cannot send to alice@example.edu via 127.0.0.1:{port}: ")
    assert "connection refused" in outcome.reason
    assert notification_rows(engine) == [("alice", "idle_gpu_warning", 4242, "failed")]


def test_a_server_that_never_answers_fails_after_the_timeout(engine: Engine) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes the handshake; no greeting ever comes
        port = silent.getsockname()[1]
        settings = settings_for(port, timeout=timedelta(seconds=1))

        outcome = Mailer(settings, engine, cluster="della").notify(idle_warning(), at=T0)

    assert outcome.status is NotifyStatus.FAILED
    assert outcome.reason.endswith("no answer within 1 s")


def test_a_failed_send_does_not_use_up_the_window(smtp_server: SmtpServer, engine: Engine) -> None:
    down = Mailer(settings_for(free_port()), engine, cluster="della")
    assert down.notify(idle_warning(), at=T0).status is NotifyStatus.FAILED

    up = Mailer(settings_for(smtp_server.port), engine, cluster="della")
    outcome = up.notify(idle_warning(), at=T0 + timedelta(minutes=1))

    assert outcome.status is NotifyStatus.SENT, outcome.reason


def test_a_refused_recipient_is_a_failed_outcome_naming_the_server_answer(
    smtp_server: SmtpServer, engine: Engine
) -> None:
    smtp_server.handler.refuse.add("alice@example.edu")
    mailer = Mailer(settings_for(smtp_server.port), engine, cluster="della")

    outcome = mailer.notify(idle_warning(), at=T0)

    assert outcome.status is NotifyStatus.FAILED
    assert "refused alice@example.edu (550" in outcome.reason
    assert "\n" not in outcome.reason


def test_a_user_without_an_address_is_a_failed_outcome(
    smtp_server: SmtpServer, engine: Engine, tmp_path: Path
) -> None:
    addresses = tmp_path / "addresses"
    addresses.write_text("# user: address\nbob: robert@physics.example.edu\n")
    settings = settings_for(smtp_server.port, domain=None, address_map_file=addresses)
    mailer = Mailer(settings, engine, cluster="della")

    missing = mailer.notify(idle_warning(), at=T0)
    mapped = mailer.notify(idle_warning(job_id=9, user="bob"), at=T0)

    assert missing.status is NotifyStatus.FAILED
    assert missing.reason == f"no email address for user 'alice': add it to {addresses}"
    assert mapped.sent
    assert smtp_server.handler.received[0].rcpt_tos == ["robert@physics.example.edu"]


# -- dry run and disabled ----------------------------------------------------


def test_dry_run_sends_nothing_and_logs_recipient_and_subject(
    smtp_server: SmtpServer, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    mailer = Mailer(settings_for(smtp_server.port, dry_run=True), engine, cluster="della")

    with caplog.at_level(logging.INFO, logger="slurmgpu.notify"):
        outcome = mailer.notify(idle_warning(), at=T0)

    assert outcome.status is NotifyStatus.DRY_RUN
    assert smtp_server.handler.received == []
    [line] = [r.getMessage() for r in caplog.records if r.name == "slurmgpu.notify"]
    assert "alice@example.edu" in line
    assert outcome.subject in line
    assert notification_rows(engine) == [("alice", "idle_gpu_warning", 4242, "dry_run")]


def test_dry_run_rate_limits_like_a_live_run_but_does_not_hold_back_going_live(
    smtp_server: SmtpServer, engine: Engine
) -> None:
    dry = Mailer(settings_for(smtp_server.port, dry_run=True), engine, cluster="della")
    assert dry.notify(idle_warning(), at=T0).status is NotifyStatus.DRY_RUN
    assert dry.notify(idle_warning(), at=T0 + timedelta(hours=1)).status is (
        NotifyStatus.RATE_LIMITED
    )

    live = Mailer(settings_for(smtp_server.port), engine, cluster="della")
    assert live.notify(idle_warning(), at=T0 + timedelta(hours=2)).sent


def test_notifications_are_off_by_default_and_record_nothing(
    smtp_server: SmtpServer, engine: Engine
) -> None:
    mailer = Mailer(NotifySettings(smtp_port=smtp_server.port), engine)

    outcome = mailer.notify(idle_warning(), at=T0)

    assert outcome.status is NotifyStatus.DISABLED
    assert smtp_server.handler.received == []
    assert notification_rows(engine) == []


# -- login, admin reports ----------------------------------------------------


def test_login_uses_the_password_from_a_private_file(
    smtp_server_with_login: SmtpServer, engine: Engine, tmp_path: Path
) -> None:
    password_file = tmp_path / "smtp.pass"
    password_file.write_text("s3cret\n")
    password_file.chmod(0o600)
    settings = settings_for(
        smtp_server_with_login.port, username="slurmgpu", password_file=password_file
    )

    outcome = Mailer(settings, engine, cluster="della").notify(idle_warning(), at=T0)

    assert outcome.sent, outcome.reason
    assert smtp_server_with_login.logins == [("slurmgpu", "s3cret")]


def test_a_password_file_others_can_read_is_refused_at_start(
    engine: Engine, tmp_path: Path
) -> None:
    password_file = tmp_path / "smtp.pass"
    password_file.write_text("s3cret\n")
    password_file.chmod(0o644)
    settings = settings_for(25, username="slurmgpu", password_file=password_file)

    with pytest.raises(NotifyConfigError, match="chmod 600") as info:
        Mailer(settings, engine)
    assert info.value.key == "password_file"


def test_admin_report_goes_to_the_admin_recipients(smtp_server: SmtpServer, engine: Engine) -> None:
    settings = settings_for(
        smtp_server.port, admin_recipients=("hpc@example.edu", "Ops <ops@example.edu>")
    )

    outcome = Mailer(settings, engine).send_admin_report("Weekly idle GPUs", "3 jobs\n", at=T0)

    assert outcome.sent, outcome.reason
    [got] = smtp_server.handler.received
    assert got.rcpt_tos == ["hpc@example.edu", "ops@example.edu"]
    assert got.message["Subject"] == "Weekly idle GPUs"


# -- templates ---------------------------------------------------------------


def test_every_shipped_template_has_its_numbers_documented() -> None:
    shipped = {p.stem for p in TEMPLATES_DIR.glob("*.txt") if not p.name.startswith("_")}
    assert shipped == set(REQUIRED_NUMBERS) == set(OPTIONAL_NUMBERS) == set(DOCUMENTED_NUMBERS)
    for name, numbers in DOCUMENTED_NUMBERS.items():
        assert set(numbers) == set(REQUIRED_NUMBERS[name]) | set(OPTIONAL_NUMBERS[name])


def _action(alert: str, numbers: dict[str, float | int | str | None]) -> Action:
    return Action("p", "warn", 4242, "alice", "asked for too much", numbers, alert=alert)


@pytest.mark.parametrize("alert", sorted(DOCUMENTED_NUMBERS))
@pytest.mark.parametrize("with_others", [False, True])
@pytest.mark.parametrize("job_known", [False, True])
def test_every_shipped_template_renders_with_the_numbers_policies_provide(
    alert: str, with_others: bool, job_known: bool
) -> None:
    action = _action(alert, DOCUMENTED_NUMBERS[alert])
    others = [(msgspec.structs.replace(action, job_id=4243), None)] if with_others else []
    job = JobFacts(4242, name="train", nodes="gpu1", gpus=4) if job_known else None

    message = AlertTemplates().render(
        alert, alert_context(action, at=T0, job=job, others=others, cluster="della")
    )

    assert message.template == f"{alert}.txt"
    assert "4242" in message.subject
    assert "\n" not in message.subject
    assert "{{" not in message.body and "{%" not in message.body
    assert message.body.startswith("Hello alice,")
    assert ("4243" in message.body) is with_others


@pytest.mark.parametrize(
    ("alert", "missing"),
    [(alert, key) for alert, keys in REQUIRED_NUMBERS.items() for key in keys],
)
def test_a_template_without_a_number_it_needs_fails_loudly(alert: str, missing: str) -> None:
    numbers = {k: v for k, v in DOCUMENTED_NUMBERS[alert].items() if k != missing}

    with pytest.raises(
        NotifyTemplateError, match=rf"template {alert}\.txt: '{missing}' is undefined"
    ):
        AlertTemplates().render(alert, alert_context(_action(alert, numbers), at=T0))


def test_rightsize_advice_renders_with_any_subset_of_its_numbers() -> None:
    keys = OPTIONAL_NUMBERS["rightsize_advice"]
    full = DOCUMENTED_NUMBERS["rightsize_advice"]
    templates = AlertTemplates()
    for size in range(len(keys) + 1):
        for subset in itertools.combinations(keys, size):
            numbers = {k: full[k] for k in subset}
            message = templates.render(
                "rightsize_advice", alert_context(_action("rightsize_advice", numbers), at=T0)
            )
            assert ("--time=01:30:00" in message.body) is ("proposed_time_limit_s" in subset)
            assert ("--mem=9800M" in message.body) is ("proposed_memory_mib" in subset)
            assert ("--gpus=1" in message.body) is ("proposed_gpus" in subset)
            assert ("asked for 1-00:00:00" in message.body) is (
                {"time_limit_s", "proposed_time_limit_s"} <= set(subset)
            )


def test_none_numbers_count_as_missing() -> None:
    numbers = {**IDLE_NUMBERS, "gpus_idle": None}
    with pytest.raises(NotifyTemplateError, match="'gpus_idle' is undefined"):
        AlertTemplates().render(
            "idle_gpu_warning", alert_context(_action("idle_gpu_warning", numbers), at=T0)
        )


def test_an_alert_without_a_template_gets_the_generic_one() -> None:
    action = _action("gpu_too_powerful", {"util_pct": 7.5, "gpu_memory_gib": None})

    message = AlertTemplates().render(action.alert, alert_context(action, at=T0))

    assert message.template == "generic.txt"
    assert message.subject == "[slurmgpu] Job 4242: asked for too much"
    assert "util_pct: 7.5" in message.body
    assert "gpu_memory_gib: unknown" in message.body


def test_a_site_template_overrides_the_shipped_one(tmp_path: Path) -> None:
    (tmp_path / "idle_gpu_warning.txt").write_text(
        "Subject: Job {{ job_id }} idle {{ idle_minutes | minutes }}\nDear {{ user }}.\n"
    )
    message = AlertTemplates(tmp_path).render(
        "idle_gpu_warning", alert_context(idle_warning(), at=T0)
    )
    assert message.subject == "Job 4242 idle 1 h 5 min"
    assert message.body == "Dear alice.\n"


def test_a_site_template_with_a_missing_variable_fails_loudly_and_nothing_is_sent(
    smtp_server: SmtpServer, engine: Engine, tmp_path: Path
) -> None:
    (tmp_path / "idle_gpu_warning.txt").write_text(
        "Subject: Job {{ job_id }}\nIdle on {{ gpu_model }}.\n"
    )
    with pytest.raises(NotifyTemplateError, match="'gpu_model' is undefined"):
        AlertTemplates(tmp_path).render("idle_gpu_warning", alert_context(idle_warning(), at=T0))

    mailer = Mailer(settings_for(smtp_server.port, template_dir=tmp_path), engine)
    outcome = mailer.notify(idle_warning(), at=T0)

    assert outcome.status is NotifyStatus.FAILED
    assert outcome.reason == "template idle_gpu_warning.txt: 'gpu_model' is undefined"
    assert smtp_server.handler.received == []


def test_a_template_without_a_subject_line_is_refused(tmp_path: Path) -> None:
    (tmp_path / "idle_gpu_warning.txt").write_text("Hello {{ user }}\n")
    with pytest.raises(NotifyTemplateError, match=r'first line must be "Subject: \.\.\."'):
        AlertTemplates(tmp_path).render("idle_gpu_warning", alert_context(idle_warning(), at=T0))


# -- settings ----------------------------------------------------------------


def test_settings_from_a_mapping() -> None:
    settings = NotifySettings.from_mapping(
        {
            "enabled": True,
            "smtp_host": "smtp.example.edu",
            "smtp_port": 587,
            "starttls": True,
            "username": "slurmgpu",
            "password_file": "/etc/slurmgpu/smtp.pass",
            "domain": "example.edu",
            "admin_recipients": ["hpc@example.edu"],
            "min_interval": "3d",
            "alert_intervals": {"idle_gpu_cancel": "0s"},
            "timeout": 30,
            "dry_run": True,
        },
        "/etc/slurmgpu/config.toml",
    )
    assert settings.smtp_port == 587
    assert settings.password_file == Path("/etc/slurmgpu/smtp.pass")
    assert settings.admin_recipients == ("hpc@example.edu",)
    assert settings.min_interval == timedelta(days=3)
    assert settings.interval_for("idle_gpu_cancel") == timedelta(0)
    assert settings.interval_for("idle_gpu_warning") == timedelta(days=3)
    assert settings.timeout == timedelta(seconds=30)
    assert NotifySettings.from_mapping({}) == NotifySettings()


@pytest.mark.parametrize(
    ("mapping", "key", "message"),
    [
        ({"smtp_prot": 25}, "smtp_prot", "is not a known setting"),
        ({"smtp_port": "25"}, "smtp_port", "must be an integer from 1 to 65535"),
        ({"min_interval": "a week"}, "min_interval", "must be a duration"),
        ({"timeout": "0s"}, "timeout", "must be at least 1s"),
        (
            {"alert_intervals": {"idle_gpu_cancel": "never"}},
            "alert_intervals.idle_gpu_cancel",
            "must be a duration",
        ),
        ({"enabled": "yes"}, "enabled", "must be true or false"),
        ({"sender": "not an address"}, "sender", "must be an address"),
        ({"admin_recipients": "hpc@example.edu"}, "admin_recipients", "must be a list"),
        ({"domain": "example.edu\nBcc: x@y"}, "domain", "one-line string"),
        ({"password": "hunter2"}, "password", "set password_file"),
        ({"username": "slurmgpu"}, "password_file", "must be set when username is set"),
        (
            {"username": "u", "password_file": "/p", "smtp_host": "smtp.example.edu"},
            "starttls",
            "in clear",
        ),
        ({"enabled": True}, "domain", "must be set"),
    ],
)
def test_a_bad_config_key_is_an_error_naming_the_key(
    mapping: dict[str, Any], key: str, message: str
) -> None:
    with pytest.raises(NotifyConfigError) as info:
        NotifySettings.from_mapping(mapping, "/etc/slurmgpu/config.toml")
    assert info.value.key == key
    assert message in str(info.value)
    assert str(info.value).startswith(f"config error in /etc/slurmgpu/config.toml: notify.{key} ")
