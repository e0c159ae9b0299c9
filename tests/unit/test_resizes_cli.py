"""``sgpu resizes``: transactions with their phases, as a table and as JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner

from slurmgpu.cli.main import main
from slurmgpu.cycle.resize import KIND, OPEN
from slurmgpu.store import open_store
from slurmgpu.store.transactions import TransactionStore

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def _at(s: float) -> str:
    return (T0 + timedelta(seconds=s)).isoformat()


def test_resizes_lists_each_transaction_with_its_phases(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = TransactionStore(open_store(url).engine)
    payload = {"from_gpus": 4, "to_gpus": 2, "policy": "malleable", "t": {"decided": _at(0)}}
    done = store.create(
        41, KIND, "planned", at=T0, deadline=None, payload=payload, open_states=OPEN
    )
    assert done is not None
    timeline = {
        "decided": _at(0),
        "signaled": _at(0),
        "acked": _at(1),
        "requeued": _at(1),
        "pending": _at(2),
        "eligible": _at(5),
        "released": _at(5),
        "started": _at(5),
        "running": _at(6),
    }
    store.advance(done, "running", at=T0 + timedelta(seconds=6), payload={"t": timeline})
    aborted = store.create(
        42, KIND, "signaled", at=T0, deadline=None, payload=payload, open_states=OPEN
    )
    assert aborted is not None
    store.advance(aborted, "aborted", at=T0, error="no checkpoint acknowledgement in time")

    out = CliRunner().invoke(main, ["--db", url, "resizes", "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["job_id"]: r for r in json.loads(out.output)}
    assert rows[41]["state"] == "running" and rows[41]["from_gpus"] == 4
    assert rows[41]["phases_s"] == {
        "checkpoint": 1.0,
        "stop": 1.0,
        "requeue_delay": 4.0,
        "scheduling": 0.0,
        "total": 6.0,
    }
    assert rows[42]["error"] == "no checkpoint acknowledgement in time"

    table = CliRunner().invoke(main, ["--db", url, "resizes", "--job", "41"])
    assert table.exit_code == 0, table.output
    assert "4 -> 2 GPUs" in table.output and "running" in table.output
    assert "1 resize(s)" in table.output and "aborted" not in table.output
