"""slurmgpu.elastic.shrunk_env: the batch script's Slurm variables after NumNodes= on the
running job (srun refuses a step whose SLURM_JOB_NUM_NODES disagrees with the job)."""

from __future__ import annotations

import pytest

from slurmgpu.elastic.shrunk_env import compress_counts, expand_counts, shrunk_env


@pytest.mark.parametrize(
    ("text", "counts"),
    [("1(x2)", [1, 1]), ("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("1,2,1", [1, 2, 1])],
)
def test_per_node_counts_round_trip(text: str, counts: list[int]) -> None:
    assert expand_counts(text) == counts
    assert compress_counts(counts) == text


def test_a_per_node_list_slurm_never_writes_is_not_read() -> None:
    assert expand_counts("2(x)") is None and expand_counts("") is None


def test_the_nodes_kept_keep_their_own_entries() -> None:
    env = {
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_NNODES": "3",
        "SLURM_JOB_NODELIST": "gpu[1-3]",
        "SLURM_NODELIST": "gpu[1-3]",
        "SLURM_TASKS_PER_NODE": "2,1(x2)",
        "SLURM_JOB_CPUS_PER_NODE": "8,4(x2)",
        "SLURM_NTASKS": "4",
        "PATH": "/bin",
    }
    out = shrunk_env(env, 2, "gpu[1,3]")
    assert out == {
        **env,
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "gpu[1,3]",
        "SLURM_NODELIST": "gpu[1,3]",
        "SLURM_TASKS_PER_NODE": "2,1",
        "SLURM_JOB_CPUS_PER_NODE": "8,4",
        "SLURM_NTASKS": "3",
    }
    assert env["SLURM_NNODES"] == "3"  # the caller's mapping is left alone


def test_unreadable_lists_keep_the_first_nodes_and_scale_the_tasks() -> None:
    env = {"SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[1-", "SLURM_NTASKS": "8"}
    out = shrunk_env(env, 1, "gpu1")
    assert (out["SLURM_JOB_NUM_NODES"], out["SLURM_NNODES"], out["SLURM_NTASKS"]) == ("1", "1", "4")
    assert out["SLURM_JOB_NODELIST"] == "gpu1"
