"""The daemon's status API as a user asks it on the lab: a real MUNGE credential made as
that user, and the ``GET /v1/jobs`` answer."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest

from slurmgpu.wire import body_digest
from tests.slurm.harness import Telemetry


def status(t: Telemetry, header: str, query: str = "") -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"http://127.0.0.1:{t.port}/v1/jobs{query}")
    req.add_header("Authorization", header)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def munge_as(user: str) -> str:
    payload = f"status\n{body_digest(b'')}".encode()
    proc = subprocess.run(
        ["runuser", "-u", user, "--", "munge"],
        input=payload,
        capture_output=True,
        timeout=30,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"munge as {user} failed: {proc.stderr.decode().strip()}")
    return "Munge " + proc.stdout.decode().strip()
