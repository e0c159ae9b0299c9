"""The daemon lease: one writer per database, takeover when the holder is dead or silent."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine

from slurmgpu.daemon.lease import DaemonLease, LeaseHeld, LeaseKeeper, LeaseLost
from slurmgpu.store import open_store


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2025, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def engine(tmp_path: Path) -> Engine:
    return open_store(f"sqlite:///{tmp_path / 'state.db'}").engine


def alive(_pid: int, _started: float) -> bool:
    return True


def test_a_second_daemon_is_refused_with_one_line_naming_the_holder(tmp_path: Path) -> None:
    e = engine(tmp_path)
    first = DaemonLease(e, host="hostA", pid=111, alive=alive)
    first.acquire()
    second = DaemonLease(e, host="hostB", pid=222, alive=alive)
    with pytest.raises(LeaseHeld) as info:
        second.acquire()
    message = str(info.value)
    assert "hostA:111" in message and "--standby" in message
    assert "\n" not in message
    assert first.valid() and not second.valid()


def test_an_expired_lease_is_taken_over_and_the_old_holder_learns_it_lost(
    tmp_path: Path,
) -> None:
    e, clock = engine(tmp_path), Clock()
    ttl = timedelta(seconds=30)
    first = DaemonLease(e, ttl=ttl, clock=clock, host="hostA", pid=1, alive=alive)
    first.acquire()
    second = DaemonLease(e, ttl=ttl, clock=clock, host="hostB", pid=2, alive=alive)
    clock.now += timedelta(seconds=29)
    assert second.try_acquire() is not None, "still live one second before expiry"
    clock.now += timedelta(seconds=2)
    assert not first.valid(), "the holder knows its own lease lapsed"
    assert second.try_acquire() is None
    holder = second.current()
    assert holder is not None and holder.name == "hostB:2"
    with pytest.raises(LeaseLost):
        first.renew()
    assert first.lost and not first.valid()
    first.release()  # must not free the new holder's lease
    third = DaemonLease(e, ttl=ttl, clock=clock, host="hostC", pid=3, alive=alive)
    assert third.try_acquire() is not None


def test_a_dead_daemon_on_this_host_is_replaced_at_once(tmp_path: Path) -> None:
    e = engine(tmp_path)
    DaemonLease(e, host="here", pid=10, alive=alive).acquire()
    dead = DaemonLease(e, host="here", pid=11, alive=lambda _pid, _s: False)
    assert dead.try_acquire() is None
    elsewhere = DaemonLease(e, host="there", pid=10, alive=lambda _pid, _s: False)
    assert elsewhere.try_acquire() is not None, "a pid on another host is not checkable"


def test_the_real_process_check_sees_this_process_and_not_a_finished_one() -> None:
    from slurmgpu.daemon.lease import _process_started, process_alive

    assert process_alive(os.getpid(), _process_started(os.getpid()))
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert not process_alive(int(proc.stdout), 1.0)


def test_release_frees_the_lease_for_the_next_daemon(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    e = engine(tmp_path)
    first = DaemonLease(e, host="a", pid=1, alive=alive)
    first.acquire()
    first.release()
    DaemonLease(e, host="b", pid=2, alive=alive).acquire()
    assert "took over" not in caplog.text, "a released lease is not a takeover"


def test_daemons_racing_for_a_free_lease_get_exactly_one_winner(tmp_path: Path) -> None:
    e = engine(tmp_path)
    leases = [DaemonLease(e, host=f"h{i}", pid=i, alive=alive) for i in range(8)]
    barrier = threading.Barrier(len(leases))
    won: list[int] = []

    def race(i: int) -> None:
        barrier.wait()
        if leases[i].try_acquire() is None:
            won.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(leases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    holder = leases[0].current()
    assert holder is not None and holder.name == f"h{won[0]}:{won[0]}"


def test_a_standby_takes_over_when_the_active_daemon_stops_renewing(tmp_path: Path) -> None:
    e = engine(tmp_path)
    ttl = timedelta(seconds=0.6)
    active = DaemonLease(e, ttl=ttl, host="a", pid=1, alive=alive)
    active.acquire()
    lost = threading.Event()
    keeper = LeaseKeeper(active, on_lost=lost.set)
    keeper.start()
    standby = DaemonLease(e, ttl=ttl, host="b", pid=2, alive=alive)
    stop = threading.Event()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(standby.wait_acquire(stop)))
    waiter.start()
    waiter.join(timeout=1.5)
    assert waiter.is_alive(), "the standby must wait while the active daemon renews"
    keeper.stop()  # the active daemon hangs or dies: no more heartbeats
    waiter.join(timeout=10)
    assert result == [True]
    assert standby.valid()
    with pytest.raises(LeaseLost):
        active.renew()


def test_a_standby_stops_waiting_when_told(tmp_path: Path) -> None:
    e = engine(tmp_path)
    DaemonLease(e, host="a", pid=1, alive=alive).acquire()
    stop = threading.Event()
    stop.set()
    assert DaemonLease(e, host="b", pid=2, alive=alive).wait_acquire(stop) is False


def test_a_lost_lease_stops_the_keeper_and_calls_back(tmp_path: Path) -> None:
    e, clock = engine(tmp_path), Clock()
    ttl = timedelta(seconds=0.3)
    mine = DaemonLease(e, ttl=ttl, host="a", pid=1, alive=alive)
    mine.acquire()
    # Someone takes it over (e.g. an operator's standby after a long pause of this one).
    other = DaemonLease(e, ttl=ttl, clock=clock, host="b", pid=2, alive=alive)
    clock.now = datetime.now(UTC) + timedelta(hours=1)
    assert other.try_acquire() is None
    lost = threading.Event()
    keeper = LeaseKeeper(mine, on_lost=lost.set)
    keeper.start()
    assert lost.wait(timeout=5)
    keeper.stop()
    assert mine.lost


def test_renewal_failing_on_a_read_only_database_lapses_the_lease(tmp_path: Path) -> None:
    e, clock = engine(tmp_path), Clock()
    ttl = timedelta(seconds=30)
    lease = DaemonLease(e, ttl=ttl, clock=clock, host="a", pid=1, alive=alive)
    lease.acquire()
    lease.engine = create_engine(f"sqlite:///file:{tmp_path / 'state.db'}?mode=ro&uri=true")
    clock.now += timedelta(seconds=10)
    from slurmgpu.daemon.lease import LeaseError

    with pytest.raises(LeaseError, match="cannot renew"):
        lease.renew()
    assert lease.valid(), "still within the ttl of the last renewal"
    clock.now += timedelta(seconds=25)
    assert not lease.valid(), "no renewal for a whole ttl: policies must pause"
    lease.engine = e
    lease.renew()
    assert lease.valid()


def test_sgpu_daemon_refuses_to_start_while_another_holds_the_lease(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    DaemonLease(open_store(url).engine).acquire()  # this test process: alive, same host
    config = tmp_path / "c.toml"
    config.write_text(f'[daemon]\nsecret_file = "{tmp_path / "s"}"\n')
    env = {**os.environ, "SGPU_DB": url, "SGPU_CONFIG": str(config)}
    proc = subprocess.run(
        [sys.executable, "-m", "slurmgpu", "daemon", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("sgpu:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("sgpu: another daemon (") and "holds the database lease" in lines[0]


def test_on_postgresql_racing_daemons_get_one_winner_and_a_stale_lease_moves(
    postgres_url: str,
) -> None:
    from sqlalchemy import delete

    from slurmgpu.store import schema

    e = open_store(postgres_url).engine
    with e.begin() as conn:
        conn.execute(delete(schema.meta).where(schema.meta.c.key == "daemon_lease"))
    clock = Clock()
    ttl = timedelta(seconds=30)
    leases = [
        DaemonLease(e, ttl=ttl, clock=clock, host=f"h{i}", pid=i, alive=alive) for i in range(8)
    ]
    barrier = threading.Barrier(len(leases))
    won: list[int] = []

    def race(i: int) -> None:
        barrier.wait()
        if leases[i].try_acquire() is None:
            won.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(leases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    clock.now += timedelta(seconds=31)
    other = leases[(won[0] + 1) % len(leases)]
    assert other.try_acquire() is None
    with pytest.raises(LeaseLost):
        leases[won[0]].renew()
    e.dispose()
