"""Usage samples: the ingest (store/sample_ingest.py) and the per-job reads
(store/usage_query.py) of one cluster's samples, as one store the daemon and reports share.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine

from slurmgpu.store.sample_ingest import Placement, SampleIngest
from slurmgpu.store.usage_query import UsageQuery


class UsageStore(SampleIngest, UsageQuery):
    """Writes agents' samples and answers per-job usage questions."""

    def __init__(
        self,
        engine: Engine,
        cluster: str = "",
        *,
        placement: Placement | None = None,
        clock: Any = time.time,
    ) -> None:
        SampleIngest.__init__(self, engine, cluster, placement=placement, clock=clock)
