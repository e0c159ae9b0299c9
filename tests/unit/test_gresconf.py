"""gres.conf lines that share GPUs: MIG-typed GPU lines and ``Name=mps`` lines."""

from __future__ import annotations

import pytest

from slurmgpu.telemetry.gresconf import GresConfError, mps_minors, parse_gres_conf

# Hand-written in the shape of gres.conf MIG lines (MultipleFiles: parent GPU first,
# then its nvidia-caps files); not yet checked against a real AutoDetect=nvml node.
MIG_AND_MPS = """\
NodeName=n[1-2] Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21
NodeName=n[1-2] Name=gpu Type=1g.10gb+me MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap30
NodeName=n[1-2] Name=gpu Type=a100 File=/dev/nvidia[1-2]
NodeName=n[1-2] Name=mps Count=200 File=/dev/nvidia[1-2]
NodeName=n9 Name=mps Count=100 File=/dev/nvidia3
Name=mps Count=50
"""


def test_mig_lines_are_gpus_typed_by_profile_on_their_parents_minor() -> None:
    devices = parse_gres_conf(MIG_AND_MPS, "n1")
    assert [(d.index, d.minor, d.gpu_type) for d in devices] == [
        (0, 0, "3g.40gb"),
        (1, 0, "1g.10gb+me"),
        (2, 1, "a100"),
        (3, 2, "a100"),
    ]


def test_mps_minors_are_the_files_of_this_nodes_mps_lines() -> None:
    assert mps_minors(MIG_AND_MPS, "n1") == {1, 2}
    assert mps_minors(MIG_AND_MPS, "n9") == {3}
    assert mps_minors("Name=gpu File=/dev/nvidia0\n", "n1") == set()


def test_a_broken_mps_line_names_its_line() -> None:
    with pytest.raises(GresConfError, match="line 2"):
        mps_minors('Name=gpu File=/dev/nvidia0\nName=mps File="/dev/nvidia0\n', "n1")
