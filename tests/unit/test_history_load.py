"""The daemon's history loader (store/history.py) reads back what the observer stored,
including how many times Slurm restarted each job (the priors set no time limit from a
restarted job's runs: its run time is the last run's only)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from slurmgpu.daemon.observer import Observer
from slurmgpu.model import Job, JobState
from slurmgpu.policy.base import HistoryRecord
from slurmgpu.store import open_store
from slurmgpu.store.history import HistoryLoader, _from_summary, _usage, load_history
from slurmgpu.store.usage import UsageStore
from tests.fakes import FakeSlurm
from tests.hypothesis_profiles import examples

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _finished(job_id: int, restarts: int) -> Job:
    start = NOW - timedelta(hours=2)
    return Job(
        job_id=job_id,
        name="train",
        user="alice",
        state=JobState.COMPLETED,
        partition="gpu",
        submit_time=start - timedelta(hours=5),
        start_time=start,  # Slurm's start time: the last run's
        end_time=start + timedelta(minutes=40),
        time_limit=timedelta(hours=8),
        cpus=4,
        restart_count=restarts,
    )


def test_history_carries_each_jobs_restart_count(store_url: str) -> None:
    store = open_store(store_url)
    try:
        Observer(FakeSlurm([_finished(1, 0), _finished(2, 3)]), store, clock=lambda: NOW).cycle()
        records = load_history(store.engine, store.cluster, NOW - timedelta(days=1))
        assert sorted((r.run_time, r.restarts) for r in records) == [
            (timedelta(minutes=40), 0),
            (timedelta(minutes=40), 3),
        ]
    finally:
        store.engine.dispose()


def _ended(job_id: int, end: datetime, *, state: JobState = JobState.COMPLETED) -> Job:
    return replace(
        _finished(job_id, 0),
        state=state,
        submit_time=end - timedelta(hours=3),
        start_time=end - timedelta(hours=1),
        end_time=end if state.is_terminal else None,
    )


def _summary(peak_mib: float) -> dict[str, object]:
    return {"version": 1, "nodes": {"gpu1": {"host": {"memory_max_mib": peak_mib}}}}


def test_a_reload_reads_what_ended_lately_and_gives_what_a_whole_read_gives(
    store_url: str,
) -> None:
    """The daemon's reload (HistoryLoader) against a whole read of the same store: a new
    job, one stored late that ended a little before the newest known end, a job that
    left the window, one requeued after it failed (no longer finished), and a newer
    summary of a job are all as a whole read has them; the other records, those read
    again unchanged included, are the very objects of the last load, and only the rows
    written since it were read. On SQLite and PostgreSQL."""
    store = open_store(store_url)
    usage = UsageStore(store.engine, store.cluster)
    clock = [NOW]
    slurm = FakeSlurm([_ended(i, NOW - timedelta(days=10 - i)) for i in range(1, 10)])
    observer = Observer(slurm, store, clock=lambda: clock[0])
    window = timedelta(days=9, minutes=30)  # job 1 ended 9 days ago: in it, for 30 min
    loader = HistoryLoader(store.engine, store.cluster)

    def step(at: datetime, jobs: list[Job]) -> tuple[HistoryRecord, ...]:
        clock[0] = at
        slurm.set_jobs(jobs)
        observer.cycle()
        got = loader.load(at - window, at)
        whole = load_history(store.engine, store.cluster, at - window)
        assert sorted(got, key=_key) == sorted(whole, key=_key)
        return got

    try:
        first = step(NOW, list(slurm.jobs()))
        usage.save_summary(5, _summary(1000.0), NOW)
        assert len(first) == 9 and loader.last_read == 9  # read whole
        t1 = NOW + timedelta(minutes=30)
        second = step(t1, [_ended(20, t1 - timedelta(minutes=5))])
        assert loader.last_read == 10  # all written within 10 min (overlap) of the last load
        # read again, and equal but for job 5 (a summary since): the last load's objects
        assert sum(any(r is f for f in first) for r in second) == 8
        t2 = NOW + timedelta(minutes=60)  # job 1 leaves the window
        usage.save_summary(20, _summary(3000.0), t2)
        usage.save_summary(20, _summary(4000.0), t2)  # the newer summary counts
        got = step(
            t2,
            [
                _ended(21, t1 - timedelta(minutes=30)),  # stored late: ended before job 20
                replace(  # requeued after it failed: the same job, pending again
                    _ended(9, NOW - timedelta(days=1)), state=JobState.PENDING, end_time=None
                ),
            ],
        )
        assert len(second) == 10 and len(got) == 9  # 2..8, 20, 21
        assert {r.peak_memory_mib for r in got} == {None, 1000.0, 4000.0}
        assert loader.last_read == 3  # jobs 20, 21 and 9: written since t1 (- 10 min)
        kept = {id(r) for r in second}
        assert sum(id(r) in kept for r in got) == 7  # jobs 2..8: the same objects
    finally:
        store.engine.dispose()


def _key(r: HistoryRecord) -> tuple[datetime, float]:
    return (r.ended_at, r.peak_memory_mib or 0.0)


def test_every_six_hours_the_window_is_read_whole(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'h.db'}")
    try:
        old = [_ended(1, NOW - timedelta(days=5)), _ended(2, NOW - timedelta(days=2))]
        Observer(FakeSlurm(old), store, clock=lambda: NOW).cycle()
        loader = HistoryLoader(store.engine, store.cluster)
        since = NOW - timedelta(days=90)
        loader.load(since, NOW)
        loader.load(since, NOW + timedelta(hours=1))
        assert loader.last_read == 2  # written within 10 min of the last load
        loader.load(since, NOW + timedelta(hours=2))
        assert loader.last_read == 0  # nothing written since
        before = loader.load(since, NOW + timedelta(hours=3))
        whole = loader.load(since, NOW + timedelta(hours=6))
        assert loader.last_read == 2  # read whole
        assert len(whole) == 2 and all(a is b for a, b in zip(whole, before, strict=True))
    finally:
        store.engine.dispose()


# --- a summary's figures, read straight from its JSON text -----------------------------

_NUMBER = st.one_of(
    st.none(),
    st.integers(-(10**6), 10**9),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
)
_ODD = st.one_of(st.text(max_size=3), st.booleans(), st.lists(st.integers(), max_size=2))


def _fields(names: dict[str, st.SearchStrategy[object]]) -> st.SearchStrategy[dict[str, object]]:
    """Dicts holding any of ``names`` (each with its values) and, now and then, a field
    the reader does not know."""
    return st.fixed_dictionaries(
        {}, optional={**names, "other": st.integers(), "samples": st.lists(st.integers())}
    )


_GPU = _fields(
    {
        "util_pct_mean": _NUMBER,
        "memory_max_mib": _NUMBER,
        "never_busy": st.one_of(st.none(), st.booleans()),
    }
)
_HOST = _fields({"memory_max_mib": _NUMBER, "cpu_pct_mean": _NUMBER})
_NODE = _fields(
    {"host": st.one_of(st.none(), _HOST), "gpus": st.dictionaries(st.text(max_size=2), _GPU)}
)
_SUMMARY = _fields(
    {
        "version": st.integers(),
        "nodes": st.one_of(st.none(), st.dictionaries(st.text(max_size=4), _NODE)),
    }
)


def _known(figures: dict[str, float | int | None]) -> dict[str, float | int]:
    """The figures a record gets (a missing one and a None are the same to it)."""
    return {name: value for name, value in figures.items() if value is not None}


_TWO_NODES = {
    "version": 1,
    "nodes": {
        "gpu1": {
            "host": {"memory_max_mib": 9000, "cpu_pct_mean": 750.5},
            "gpus": {
                "0": {"util_pct_mean": 80.0, "memory_max_mib": 30000.0, "never_busy": False},
                "1": {"util_pct_mean": 0.0, "memory_max_mib": 10.0, "never_busy": True},
            },
        },
        "gpu2": {
            "host": {"memory_max_mib": 4000.5, "cpu_pct_mean": None},
            "gpus": {"0": {"util_pct_mean": 55, "memory_max_mib": 20000}},
        },
    },
}


@given(_SUMMARY)
@example(_TWO_NODES)
@settings(max_examples=examples(300), deadline=None)
def test_a_summarys_figures_read_from_its_text_are_those_of_the_parsed_summary(
    summary: dict[str, object],
) -> None:
    """The typed decoder of a whole read gives exactly what a walk of the parsed JSON
    gives, whatever fields are there, missing, null or unknown."""
    assert _known(_usage(json.dumps(summary))) == _known(_from_summary(summary))


@given(_SUMMARY, st.sampled_from(["host", "gpus", "nodes", "never_busy"]), _ODD)
@settings(max_examples=examples(150), deadline=None)
def test_a_summary_of_another_shape_is_read_the_general_way_or_not_at_all(
    summary: dict[str, object], field: str, odd: object
) -> None:
    """A field of an unexpected type (not as the daemon writes it) falls back to the
    walk of the parsed JSON; a summary even that cannot read gives no figures, never an
    error that would stop the whole read."""
    nodes = summary.get("nodes")
    if field == "nodes" or not isinstance(nodes, dict) or not nodes:
        summary["nodes"] = odd
    else:
        node = next(iter(nodes.values()))
        gpus = node.get("gpus")
        if field == "never_busy" and isinstance(gpus, dict) and gpus:
            next(iter(gpus.values()))["never_busy"] = odd
        else:
            node["host" if field == "never_busy" else field] = odd
    try:
        expected = _from_summary(summary)
    except (ValueError, TypeError, AttributeError):
        expected = {}
    assert _known(_usage(json.dumps(summary))) == _known(expected)


def test_a_summary_that_is_no_json_object_gives_no_figures() -> None:
    for text in ("not json", "[]", "[1, 2]", '"a"', "null", '{"nodes": [1]}'):
        assert _usage(text) == {}, text
    assert _usage(None) == {}


def test_a_two_node_summary_gives_the_jobs_figures() -> None:
    """Memory peaks summed over nodes (the job's) and the largest (a node's), CPU summed,
    GPU utilisation averaged over the GPUs that sent one, the largest GPU memory peak,
    and the GPUs ever busy (a GPU that does not say counts as never busy)."""
    assert _usage(json.dumps(_TWO_NODES)) == {
        "peak_memory_mib": 13000.5,
        "peak_node_memory_mib": 9000.0,
        "mean_cpu_pct": 750.5,
        "mean_gpu_util_pct": 45.0,
        "peak_gpu_memory_mib": 30000.0,
        "gpus_used": 1,
    }
