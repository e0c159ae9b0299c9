"""Every alert the idle policy raises renders through its shipped template (not the
generic fallback) with the numbers the policy really provides."""

from __future__ import annotations

from datetime import timedelta

import pytest

from slurmgpu.notify import alert_context
from slurmgpu.notify.render import AlertTemplates
from slurmgpu.policy.idle import IdleGpuPolicy
from tests.unit.policy_builders import T0, alert, gpu, running_job, snapshot, usage


@pytest.mark.parametrize(
    ("earlier", "idle_minutes", "template"),
    [
        ((), 70, "idle_gpu_warning.txt"),
        ((("idle_gpu_warning_1", 60),), 110, "idle_gpu_warning.txt"),
        ((("idle_gpu_warning_1", 70), ("idle_gpu_warning_2", 25)), 130, "idle_gpu_action.txt"),
    ],
)
def test_idle_alerts_render_with_their_own_template(
    earlier: tuple[tuple[str, int], ...], idle_minutes: int, template: str
) -> None:
    job = running_job(7, requeue=True, started=timedelta(hours=3))
    snap = snapshot(
        [job],
        usage_by_job=[usage(7, gpu(idle=timedelta(minutes=idle_minutes), never_busy=True))],
        alerts=[alert(7, name, T0 - timedelta(minutes=ago)) for name, ago in earlier],
    )
    (action,) = IdleGpuPolicy().propose(snap)
    message = AlertTemplates(None).render(action.alert, alert_context(action, at=T0))
    assert message.template == template
    assert "7" in message.subject
    assert "\n" not in message.subject


def test_the_idle_email_says_how_much_energy_the_job_used_and_how_much_while_idle() -> None:
    from slurmgpu.daemon.policy_cycle import MailNotifier
    from slurmgpu.report.energy import JobEnergy

    job = running_job(7, requeue=True, started=timedelta(hours=3))
    snap = snapshot(
        [job], usage_by_job=[usage(7, gpu(idle=timedelta(minutes=70), never_busy=True))]
    )
    (action,) = IdleGpuPolicy().propose(snap)

    class Mailer:
        def __init__(self) -> None:
            self.sent: list[object] = []

        def notify(self, a: object, *, at: object) -> object:
            self.sent.append(a)
            return type("Outcome", (), {"status": "sent"})()

    mailer = Mailer()
    energy = JobEnergy(41 * 3.6e6, 0.6 * 41 * 3.6e6, "counter", 0.0, 2)
    asked: list[int] = []

    def energy_of(job_id: int) -> JobEnergy:
        asked.append(job_id)
        return energy

    notifier = MailNotifier(mailer, energy_of)
    assert notifier.notify(action, at=T0) == "sent"
    (enriched,) = mailer.sent
    assert asked == [7]
    context = alert_context(enriched, at=T0)  # type: ignore[arg-type]
    message = AlertTemplates(None).render(action.alert, context)
    assert "used 41.0 kWh of GPU energy" in message.body.replace("\n", " ")
    assert "60 % of it" in message.body and "NVML energy counter" in message.body
    # unknown energy: the email is the same as before, without the line
    plain = AlertTemplates(None).render(action.alert, alert_context(action, at=T0))
    assert "kWh" not in plain.body
