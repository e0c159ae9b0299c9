"""A small store with hand-computable report figures (tests/unit/test_report*.py).

Window: 2026-03-01 to 2026-03-08 (UTC). Every figure the tests expect is worked out in
:data:`EXPECTED` from the rows below, by hand, so a wrong SQL aggregate cannot agree
with it by construction.

Jobs in the window (finished, asked for GPUs):
  101 alice/acct-a/gpu: 2 GPUs, 4 h, COMPLETED, limit 24 h, --mem 64000; GPU0 80 %,
      GPU1 never busy; 10000 MiB peak -> 8 GPU-h, util 40 %, idle 50 %: used 3.2, idle 4,
      unused 4.8; flags idle, over-time, over-memory, over-gpus. Wait 30 s.
  102 bob/acct-b/gpu: 1 GPU, 10 h, COMPLETED, limit 12 h, --mem 16000; 95 %, 15000 MiB
      -> 10 GPU-h, used 9.5, unused 0.5, no flag. An older summary (a previous run, made
      before this start) says 5 %: must be ignored. Wait 1 h (eligible 1 h before start).
  103 bob/acct-b/debug: 4 GPUs, 1 h, FAILED, no summary -> 4 GPU-h, usage unknown.
      Wait 300 s.
  104 carol/acct-a/gpu: 4 shards (16 per GPU on the nodes: 0.25 GPU), 2 h, COMPLETED,
      limit 4 h; 10 % -> 0.5 GPU-h, used 0.05, unused 0.45; flags low-util, over-time.
      Wait 8 h.
  108 alice/acct-a/gpu: 1 GPU, 200 s, never busy -> 1/18 GPU-h all idle; too short
      for flags. Wait 0.
Left out: 105 (ended before the window), 106 (no GPU), 107 (still running).

Actions in the window: idle_gpu requeue of 101 done 3 h into its run, 1 idle GPU
(-> 1 x (24 - 3) = 21 GPU-h); rightsize of 102 done, 2 -> 1 GPUs (1 x 10 h = 10) and
24 h -> 12 h limit (1 GPU x 12 h = 12 reserved); colocate of 104 done, 4 of 16 shards
((1 - 4/16) x 2 h = 1.5); idle_gpu warn of 101 skipped (advise). One rightsize before the
window. A malleable resize of 101 from 4 to 2 GPUs reached running 1 h into its run
(2 x 3 h = 6).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, insert, select

from slurmgpu.store import schema
from slurmgpu.store.usage import UsageStore

SINCE = datetime(2026, 3, 1, tzinfo=UTC)
UNTIL = datetime(2026, 3, 8, tzinfo=UTC)
H = 3600.0


def _at(day: int, hour: float = 0.0) -> datetime:
    return datetime(2026, 3, day, tzinfo=UTC) + timedelta(hours=hour)


def _job(job_id: int, user: str, account: str, partition: str, **kw: Any) -> dict[str, Any]:
    seen = kw.get("end_time") or kw.get("start_time") or SINCE
    row: dict[str, Any] = {
        "cluster": "",
        "job_id": job_id,
        "name": f"job{job_id}",
        "user": user,
        "account": account,
        "partition": partition,
        "state": "COMPLETED",
        "cpus": 4,
        "first_seen": seen,
        "last_seen": seen,
        "updated_at": seen,
        "gpus": 0,
        "shards": 0,
        "memory_mib": None,
        "time_limit_s": None,
        "eligible_time": None,
        "submit_time": None,
        "start_time": None,
        "end_time": None,
    }
    row.update(kw)
    return row


def _gpu(util: float, *, never_busy: bool = False, trailing_s: int = 0) -> dict[str, Any]:
    return {
        "samples": 10,
        "util_pct_mean": util,
        "util_pct_max": util,
        "memory_max_mib": 1000.0,
        "memory_total_mib": 81920.0,
        "idle_trailing_s": trailing_s,
        "never_busy": never_busy,
        "shared": False,
    }


def _summary(
    elapsed_s: float, gpus: int, per_gpu: list[dict[str, Any]], host_mib: float | None
) -> dict[str, Any]:
    node: dict[str, Any] = {"gpus": {str(i): g for i, g in enumerate(per_gpu)}}
    if host_mib is not None:
        node["host"] = {"samples": 10, "cpus": 4, "memory_max_mib": host_mib}
    return {
        "version": 1,
        "elapsed_s": int(elapsed_s),
        "gpus_requested": gpus,
        "nodes": {"gpu1": node},
    }


def fill(engine: Engine) -> None:
    """Write the rows described in the module docstring."""
    jobs = [
        _job(
            101,
            "alice",
            "acct-a",
            "gpu",
            gpus=2,
            start_time=_at(2),
            end_time=_at(2, 4),
            submit_time=_at(2) - timedelta(seconds=30),
            time_limit_s=24 * 3600,
            memory_mib=64000,
        ),
        _job(
            102,
            "bob",
            "acct-b",
            "gpu",
            gpus=1,
            start_time=_at(3),
            end_time=_at(3, 10),
            submit_time=_at(3, -3),
            eligible_time=_at(3, -1),
            time_limit_s=12 * 3600,
            memory_mib=16000,
        ),
        _job(
            103,
            "bob",
            "acct-b",
            "debug",
            gpus=4,
            state="FAILED",
            start_time=_at(4),
            end_time=_at(4, 1),
            submit_time=_at(4) - timedelta(seconds=300),
            time_limit_s=2 * 3600,
        ),
        _job(
            104,
            "carol",
            "acct-a",
            "gpu",
            shards=4,
            start_time=_at(5),
            end_time=_at(5, 2),
            submit_time=_at(5, -8),
            time_limit_s=4 * 3600,
        ),
        _job(
            108,
            "alice",
            "acct-a",
            "gpu",
            gpus=1,
            start_time=_at(6),
            end_time=_at(6) + timedelta(seconds=200),
            submit_time=_at(6),
            time_limit_s=3600,
        ),
        _job(
            105,
            "alice",
            "acct-a",
            "gpu",
            gpus=8,
            start_time=_at(1, -30),
            end_time=_at(1, -2),
            submit_time=_at(1, -31),
        ),
        _job(
            106, "dave", "acct-b", "cpu", start_time=_at(3), end_time=_at(3, 5), submit_time=_at(3)
        ),
        _job(
            107,
            "dave",
            "acct-b",
            "gpu",
            gpus=2,
            state="RUNNING",
            start_time=_at(6),
            submit_time=_at(6),
        ),
    ]
    with engine.begin() as conn:
        conn.execute(insert(schema.jobs), jobs)
        conn.execute(
            insert(schema.nodes),
            {
                "cluster": "",
                "name": "gpu1",
                "state": "idle",
                "gpus": 4,
                "shards": 64,
                "last_seen": SINCE,
            },
        )
        rows = dict(conn.execute(select(schema.jobs.c.job_id, schema.jobs.c.id)).all())
        conn.execute(
            insert(schema.job_events),
            {
                "job_row": rows[101],
                "at": _at(2),
                "kind": "state",
                "from_state": "PENDING",
                "to_state": "RUNNING",
                "restart_count": 0,
            },
        )
        actions = [
            _action(_at(2, 3), 101, "idle_gpu", "requeue", "enforce", "done", {"idle_gpus": 1}),
            _action(_at(2, 1), 101, "idle_gpu", "warn", "advise", "skipped", {"idle_gpus": 1}),
            _action(
                _at(3, -2),
                102,
                "rightsize",
                "update",
                "enforce",
                "done",
                {
                    "gpus_current": 2,
                    "gpus_proposed": 1,
                    "time_limit_current_s": 86400,
                    "time_limit_proposed_s": 43200,
                },
            ),
            _action(
                _at(5, -1),
                104,
                "colocate",
                "update",
                "enforce",
                "done",
                {"shards_proposed": 4, "shards_per_gpu": 16},
            ),
            _action(
                _at(1, -200),
                102,
                "rightsize",
                "update",
                "enforce",
                "done",
                {"gpus_current": 8, "gpus_proposed": 1},
            ),
        ]
        conn.execute(insert(schema.actions), actions)
        conn.execute(
            insert(schema.transactions),
            {
                "cluster": "",
                "job_id": 101,
                "kind": "resize",
                "state": "running",
                "created_at": _at(2, 0.5),
                "updated_at": _at(2, 1),
                "attempts": 0,
                "payload": {"from_gpus": 4, "to_gpus": 2},
            },
        )
    usage = UsageStore(engine)
    usage.save_summary(
        101, _summary(4 * H, 2, [_gpu(80.0), _gpu(0.0, never_busy=True)], 10000.0), _at(2, 4.01)
    )
    usage.save_summary(102, _summary(5 * H, 1, [_gpu(5.0)], 1000.0), _at(2))  # a previous run
    usage.save_summary(102, _summary(10 * H, 1, [_gpu(95.0)], 15000.0), _at(3, 10.01))
    usage.save_summary(104, _summary(2 * H, 0, [_gpu(10.0)], None), _at(5, 2.01))
    usage.save_summary(108, _summary(200, 1, [_gpu(0.0, never_busy=True)], 500.0), _at(6, 0.1))


def _action(
    at: datetime,
    job_id: int,
    policy: str,
    kind: str,
    mode: str,
    outcome: str,
    numbers: dict[str, Any],
) -> dict[str, Any]:
    return {
        "at": at,
        "cluster": "",
        "job_id": job_id,
        "policy": policy,
        "kind": kind,
        "mode": mode,
        "taken": outcome == "done",
        "reason": "test",
        "numbers": numbers,
        "user": "",
        "outcome": outcome,
    }


SHORT = 1 / 18  # 1 GPU x 200 s in hours
EXPECTED: dict[str, Any] = {
    "jobs": 5,
    "jobs_with_usage": 4,
    "allocated": 8 + 10 + 4 + 0.5 + SHORT,
    "with_usage": 8 + 10 + 0.5 + SHORT,
    "used": 3.2 + 9.5 + 0.05 + 0.0,
    "idle": 4 + 0 + 0 + SHORT,
    "unused": 4.8 + 0.5 + 0.45 + SHORT,
    "flags": {"idle": 1, "low-util": 1, "over-time": 2, "over-memory": 1, "over-gpus": 1},
    "flagged": 2,
    "wait_mean_s": (30 + 3600 + 300 + 8 * 3600 + 0) / 5,
    "wait_max_s": 8 * 3600.0,
    # wait bins: < 1m, 1m-10m, 10m-1h, 1h-6h, >= 6h
    "waits": [2, 1, 0, 1, 1],
    # (bin lower edge %, jobs, GPU-hours); then unknown
    "histogram": {0: (1, SHORT), 10: (1, 0.5), 40: (1, 8.0), 90: (1, 10.0)},
    "unknown": (1, 4.0),
    "users": {"bob": 14.0, "alice": 8 + SHORT, "carol": 0.5},
    "wasters": ["alice", "bob", "carol"],
    "alice_worst": [101, 108],
    "flagged_jobs": [101, 104],
    "partitions": {"gpu": 8 + 10 + 0.5 + SHORT, "debug": 4.0},
    # day index in the window -> allocated GPU-hours of the jobs that ended then
    "series": {1: 8.0, 2: 10.0, 3: 4.0, 4: 0.5, 5: SHORT},
    "actions": {
        ("colocate", "update", "enforce", "done"): 1,
        ("idle_gpu", "requeue", "enforce", "done"): 1,
        ("idle_gpu", "warn", "advise", "skipped"): 1,
        ("rightsize", "update", "enforce", "done"): 1,
    },
    # (policy, kind) -> (actions, estimated, GPU-h returned, reservation GPU-h released)
    "reclaimed": {
        ("colocate", "update"): (1, 1, 1.5, 0.0),
        ("idle_gpu", "requeue"): (1, 1, 21.0, 0.0),
        ("rightsize", "update"): (1, 1, 10.0, 12.0),
        ("malleable", "shrink"): (1, 1, 6.0, 0.0),
    },
    # day index -> {outcome: count}
    "action_series": {1: {"done": 2, "skipped": 1}, 3: {"done": 1}},
}
