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
