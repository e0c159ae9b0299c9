"""A training stand-in for tests/unit/test_launcher.py, run by torchrun under ``sgpu launch``.

Each rank appends ``RANK STEP`` to ``$LAUNCH_TEST_LOG`` every step and, when asked,
checkpoints with the toy runtime (rank 0 writes the ack) and waits to be requeued.
"""

from __future__ import annotations

import os
import time

from slurmgpu import elastic


def main() -> None:
    run = elastic.init()
    log = os.environ["LAUNCH_TEST_LOG"]
    step = 0
    while True:
        step += 1
        with open(log, "a", encoding="ascii") as f:
            f.write(f"{run.rank} {step} {os.getpid()}\n")
        time.sleep(0.05)
        if run.checkpoint_requested:
            run.checkpoint({"step": step})


if __name__ == "__main__":
    main()
