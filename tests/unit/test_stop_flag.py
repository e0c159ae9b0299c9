"""slurmgpu.stop_flag: an event that signal handlers may set (threading.Event's set takes
a lock and deadlocks a handler that lands while the main thread holds it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmgpu.stop_flag import StopFlag
from tests.signal_storm import storm

ROOT = Path(__file__).resolve().parents[2]


def test_wait_times_out_then_sees_a_set_from_another_thread() -> None:
    flag = StopFlag()
    assert not flag.is_set() and flag.wait(0.01) is False
    timer = threading.Timer(0.05, flag.set)
    timer.start()
    assert flag.wait(30) is True and flag.is_set()
    assert flag.wait(0) is True  # stays set for every waiter
    flag.clear()
    assert not flag.is_set() and flag.wait(0.01) is False
    timer.join()


@pytest.fixture
def usr1_restored() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_a_handler_sets_it_while_the_main_thread_waits(usr1_restored: None) -> None:
    flag = StopFlag()
    signal.signal(signal.SIGUSR1, lambda signum, frame: flag.set())
    # kill(), as from outside: the kernel hands a process's signal to its main thread
    timer = threading.Timer(0.05, os.kill, args=(os.getpid(), signal.SIGUSR1))
    timer.start()
    started = time.monotonic()
    assert flag.wait(30) is True
    assert time.monotonic() - started < 25  # woken by the handler, not by the timeout
    timer.join()


STORM = """
import os, signal
from slurmgpu.stop_flag import StopFlag
wake, stop = StopFlag(), StopFlag()
signal.signal(signal.SIGUSR1, lambda s, f: wake.set())
signal.signal(signal.SIGTERM, lambda s, f: stop.set())
print("waiting", flush=True)
while not stop.wait(0.001):
    wake.clear()  # the waiting thread takes and leaves the flag's state all the time
os._exit(0)  # not sys.exit: the SIGTERMs still coming would kill the teardown
"""


@pytest.mark.slow  # a 1.5 s storm
def test_signal_storms_never_wedge_a_waiting_main_thread() -> None:
    env = {"PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", STORM], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "waiting"
        storm(proc, signal.SIGUSR1)
        for _ in range(100):
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
