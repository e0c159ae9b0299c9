"""Hypothesis strategies for any Job a store must keep exactly (text, times, GRES, allocations)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import strategies as st

from slurmgpu.model import GpuRequest, Job, JobState, NodeGpuAllocation

times = st.one_of(
    st.none(),
    st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ).map(lambda d: d.replace(microsecond=0)),
)

small = st.integers(min_value=0, max_value=10_000)

jobs = st.builds(
    Job,
    job_id=st.integers(min_value=1, max_value=2**40),
    name=st.text(max_size=20),
    user=st.text(max_size=10),
    state=st.sampled_from(list(JobState)),
    uid=st.none() | small,
    state_flags=st.frozensets(st.sampled_from(["REQUEUED", "COMPLETING", "CONFIGURING"])),
    array_job_id=st.none() | small,
    array_task_id=st.none() | small,
    submit_time=times,
    start_time=times,
    end_time=times,
    time_limit=st.none() | small.map(lambda m: timedelta(minutes=m)),
    cpus=small,
    memory_mib=st.none() | small,
    gpus=st.builds(
        GpuRequest,
        gpus=small,
        per_node=st.none() | small,
        shards=small,
        gpu_type=st.none() | st.sampled_from(["a100", "h100", "1g.10gb", "3g.40gb+me"]),
        mps=small,
        mps_per_node=st.none() | small,
        sources=st.lists(
            st.sampled_from(["tres_per_node", "tres_per_job"]), max_size=2, unique=True
        ).map(tuple),
    ),
    nodes=st.lists(st.sampled_from(["gpu1", "gpu2", "n-3"]), max_size=3, unique=True).map(tuple),
    gpu_allocations=st.lists(
        st.builds(
            NodeGpuAllocation,
            node=st.sampled_from(["gpu1", "gpu2"]),
            gpu_indices=st.lists(st.integers(0, 7), max_size=4).map(tuple),
            shards=small,
            mps_indices=st.lists(st.integers(0, 7), max_size=2).map(tuple),
            mps=small,
        ),
        max_size=2,
    ).map(tuple),
    restart_count=small,
    requeue=st.booleans(),
    comment=st.text(max_size=30),
    exit_code=st.none() | st.integers(0, 255),
)
