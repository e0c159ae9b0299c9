"""What a resize, a requeue and a job's start cost in the simulator: named, versioned
cost sets, each cost with where it comes from.

The simulator charges seven costs (seconds), each :class:`Cost` carrying its provenance
(which bench, which Slurm release, which date, the median of how many samples):

- ``checkpoint``: a checkpoint signal → the runtime's acknowledgement (the job pauses).
- ``startup``: a restarted run's start → its first step (loading the checkpoint).
- ``first_startup``: a job's first run's start → its first step (process start-up:
  interpreter, framework imports, rendezvous). A fixed cost every job pays once.
- ``submit_delay``: a submission → the first scheduling pass that may start it (Slurm's
  scheduler does not start a job the instant it is submitted). Every job pays it once.
- ``requeue_delay``: Slurm's plain requeue → the job may start again (its begin time,
  ``cred_expire`` + 1 s, plus the wait for the backfill pass that starts it): the
  ``tiresias`` baseline's preemptions, a lowered limit's restore, the executor with
  ``fast_start = false``. The daemon's fast path does not wait it out.
- ``reform``: a shrink in place (``scontrol update NumNodes=`` on the running job) →
  the command running again on the nodes kept.
- ``completing``: a job's end → its GPUs free for the next job (Slurm's COMPLETING
  state: the step's and the batch script's teardown, the epilog, the node's message
  back). Every job's GPUs pay it once, at its end.

The resize fast path's "stop" (requeue → seen pending) and "requeue delay" (pending →
released) are not costs of a set: they follow from the executor's pacing
(``cycle.resize.ResizeSettings``: one observation per second while a resize is open,
the release 1.5 s after the update), which the simulator runs as the daemon does. The
sets' notes say what the lab measured for them.

Sets (``COST_SETS``; ``DEFAULT`` is the one ``sgpu simulate`` and the benches use):

- ``slurm-22.05-lab`` (default): measured on the lab cluster with Slurm 22.05, the
  release SimSlurm models (its requeue path, its scheduling). The job's own costs are
  the PyTorch example's (``bench/resize_path.py --torch``), not the toy runtime's: the
  simulated workloads are deep-learning jobs, and torch's import and rendezvous are most
  of a restart. ``requeue_delay`` keeps Slurm's default ``cred_expire`` (120 s; the lab
  runs 10 s to keep tests short, and measured 10 + 1 s) and adds the measured wait for
  the backfill pass.
- ``slurm-24.11-lab``, ``slurm-26.05-lab``: the same on those releases (the job's own
  costs were measured on 22.05 only: they are the job's, not Slurm's).
- ``replay-stand-in``: the trace replay's own stand-in job on the 22.05 site lab with
  the lab's ``cred_expire=10``, for holding the simulator to that replay
  (``bench/replay_real.py``; scale it by the compression factor: :meth:`CostSet.scaled`).
- ``legacy``: the constants the simulator had before any measurement (a 20 s checkpoint,
  the Pollux artifact's 30 s restart, Slurm's 121 s requeue delay, no per-job fixed
  cost, a 10 s re-forming), kept so earlier figures can be reproduced.

A site's own costs: a TOML file (:func:`parse_costs`), each cost a number or a table
``{seconds = 12.0, bench = "...", release = "23.02", date = "2026-12-01", samples = 5}``,
the costs it leaves out taken from ``base`` (a set's name, the default set if absent).

Pure: parses text, reads no file.
"""

from __future__ import annotations

import datetime
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from slurmgpu.sim.progress import ElasticRuntime

__all__ = [
    "COSTS",
    "COST_SETS",
    "DEFAULT",
    "Cost",
    "CostError",
    "CostSet",
    "cost_set",
    "parse_costs",
]

# The costs of a set, in the order they are printed.
COSTS: tuple[str, ...] = (
    "checkpoint",
    "startup",
    "first_startup",
    "submit_delay",
    "requeue_delay",
    "reform",
    "completing",
)
_PROVENANCE = ("bench", "release", "date", "samples", "note")


class CostError(ValueError):
    """A cost set that cannot be used (unknown name, bad file); one line."""


@dataclass(frozen=True, slots=True)
class Cost:
    """One cost in seconds and where it comes from: the bench that measured it, on which
    Slurm release, when, the median of how many samples (0: not measured), and a note."""

    seconds: float
    bench: str
    release: str = ""
    date: str = ""
    samples: int = 0
    note: str = ""

    @property
    def measured(self) -> bool:
        return self.samples > 0

    def source(self) -> str:
        """``bench/resize_path.py --torch, Slurm 22.05, 2026-12-06, median of 3; note``."""
        parts = [self.bench]
        if self.release:
            parts.append(f"Slurm {self.release}")
        if self.date:
            parts.append(self.date)
        if self.samples == 1:
            parts.append("one sample")
        elif self.samples > 1:
            parts.append(f"median of {self.samples}")
        text = ", ".join(p for p in parts if p)
        return f"{text}; {self.note}" if self.note else text

    def as_dict(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "bench": self.bench,
            "release": self.release,
            "date": self.date,
            "samples": self.samples,
            "note": self.note,
            "source": self.source(),
        }


@dataclass(frozen=True, slots=True)
class CostSet:
    """A named, versioned set of the simulator's costs (see the module docstring)."""

    name: str
    version: int
    about: str
    checkpoint: Cost
    startup: Cost
    first_startup: Cost
    submit_delay: Cost
    requeue_delay: Cost
    reform: Cost
    completing: Cost
    # The resize fast path's stop + requeue delay + scheduling as measured: what the
    # Pollux baseline's restarts pay for the executor (sim.pollux.RestartCosts); our
    # sets' executor paces these steps itself.
    fast_path_s: float = 3.0
    notes: tuple[str, ...] = ()

    def cost(self, key: str) -> Cost:
        if key not in COSTS:
            raise KeyError(key)
        value: Cost = getattr(self, key)
        return value

    @property
    def label(self) -> str:
        """``slurm-22.05-lab v1``."""
        return f"{self.name} v{self.version}"

    def runtime(self) -> ElasticRuntime:
        """The job-side costs as SimSlurm's runtime charges them."""
        return ElasticRuntime(
            checkpoint_s=self.checkpoint.seconds,
            startup_s=self.startup.seconds,
            reform_s=self.reform.seconds,
            first_startup_s=self.first_startup.seconds,
        )

    def with_cost(self, key: str, seconds: float, source: str) -> CostSet:
        """This set with one cost replaced (an option given on the command line)."""
        if key not in COSTS:
            raise CostError(f"no cost {key!r}; the costs: {', '.join(COSTS)}")
        _check(key, seconds, source)
        changes: dict[str, Any] = {key: Cost(float(seconds), source)}
        return replace(self, **changes)

    def scaled(self, factor: float) -> CostSet:
        """Every cost times ``factor``: a replay compressed by C pays its costs in wall
        seconds, C times as many seconds of trace time as the simulator counts."""
        if not factor > 0 or not math.isfinite(factor):
            raise CostError(f"a cost set scales by a number > 0, not {factor!r}")
        scaled: dict[str, Any] = {
            k: replace(self.cost(k), seconds=self.cost(k).seconds * factor) for k in COSTS
        }
        return replace(
            self,
            name=f"{self.name} x{factor:g}",
            fast_path_s=self.fast_path_s * factor,
            **scaled,
        )

    def lines(self) -> list[str]:
        """What ``sgpu simulate`` prints: the set, then each cost and its source."""
        out = [f"cost set {self.label}: {self.about}"]
        width = max(len(k) for k in COSTS)
        for key in COSTS:
            c = self.cost(key)
            out.append(f"  {key:<{width}} {c.seconds:>7.2f} s  {c.source()}")
        out.extend(f"  {n}" for n in self.notes)
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "version": self.version,
            "about": self.about,
            "costs": {k: self.cost(k).as_dict() for k in COSTS},
            "fast_path_s": self.fast_path_s,
            "notes": list(self.notes),
        }


def _noted(cost: Cost, extra: str) -> Cost:
    return replace(cost, note=f"{cost.note}; {extra}" if cost.note else extra)


def _check(key: str, seconds: object, origin: str) -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise CostError(f"{origin}: {key} must be a number of seconds, not {seconds!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise CostError(f"{origin}: {key} must be a number of seconds >= 0, not {seconds!r}")


# ---- the measured sets

_DAY = "2026-12-06"
_RESIZE_PATH = "bench/resize_path.py --resizes 2"
_TORCH = "bench/resize_path.py --torch (the PyTorch example, 4 <-> 2 gloo ranks)"
_REPLAY = "bench/replay_real.py --first 30 --compression 60 (Pollux workload 1)"
_MULTINODE = "bench/resize_path.py --frameworks multinode (torchrun, 2 -> 1 nodes)"
_NOT_MEASURED = "assumed, not measured"

_TORCH_CHECKPOINT = Cost(
    1.03, _TORCH, "22.05", _DAY, 3, "signal -> ack seen by the daemon (toy runtime: 1.05)"
)
_TORCH_STARTUP = Cost(
    5.54,
    _TORCH,
    "22.05",
    _DAY,
    3,
    "Slurm's start -> first step: torch import, rendezvous (13.2 s in a run at load 6)",
)
_TORCH_FIRST = replace(
    _TORCH_STARTUP,
    note="a first start is a restart with no checkpoint to load: the torch start-up "
    "(the replay's stand-in, no torch: 0.56 s, median of 370 jobs)",
)
_REFORM = Cost(
    14.4,
    _MULTINODE,
    "22.05",
    _DAY,
    1,
    "the command's restart on the node kept (srun, torchrun); 15.6 s decision -> step",
)

# lab.jobcosts on the six labs of one quiet 63-job replay, every set pooled
_FIDELITY = "bench/replay_real.py --first 64 --compression 60 --labs (slurmctld's log)"
_FIDELITY_DAY = "2026-12-07"
_COMPLETING = Cost(
    0.93,
    _FIDELITY,
    "22.05",
    _FIDELITY_DAY,
    327,
    "a job's end -> the next start on its node, of a job waiting for it (Slurm's "
    "COMPLETING hold and the pass it triggers)",
)
_CTLD_STARTUP = Cost(
    0.56,
    _FIDELITY,
    "22.05",
    _FIDELITY_DAY,
    370,
    "the stand-in's run in slurmctld's log - its planned run, jobs that ran once",
)
_CTLD_SUBMIT = Cost(
    1.73,
    _FIDELITY,
    "22.05",
    _FIDELITY_DAY,
    20,
    "sbatch -> start, jobs that had room when submitted and no job before them did",
)


Phases = tuple[float, float, float, float, float]  # checkpoint, stop, delay, sched, start-up


def _lab(release: str, scheduling: float, fast: Phases) -> CostSet:
    """A lab set: Slurm's requeue path measured on ``release``, the job's own costs and
    the submission delay on 22.05 (noted so on any other release)."""
    other = release != "22.05"

    def job(cost: Cost) -> Cost:
        return _noted(cost, "measured on 22.05 only (the job's, not Slurm's)") if other else cost

    checkpoint, stop, delay, sched, startup = fast
    return CostSet(
        name=f"slurm-{release}-lab",
        version=2,
        about=f"measured on the lab cluster, Slurm {release} (the job's own costs: PyTorch)",
        checkpoint=job(_TORCH_CHECKPOINT),
        startup=job(_TORCH_STARTUP),
        first_startup=job(_TORCH_FIRST),
        submit_delay=_noted(_CTLD_SUBMIT, "measured on 22.05 only") if other else _CTLD_SUBMIT,
        requeue_delay=Cost(
            121.0 + scheduling,
            _RESIZE_PATH + " (Slurm's requeue path)",
            release,
            _DAY,
            2,
            f"cred_expire 120 (Slurm's default) + 1 s, then {scheduling:g} s measured "
            "waiting for the backfill pass (the lab: cred_expire 10, begin time 11 s)",
        ),
        reform=job(_REFORM),
        completing=_noted(_COMPLETING, "measured on 22.05 only") if other else _COMPLETING,
        fast_path_s=round(stop + delay + sched, 2),
        notes=(
            f"resize fast path on {release} ({_RESIZE_PATH}, median of 2): checkpoint "
            f"{checkpoint:g}, stop {stop:g}, requeue delay {delay:g}, scheduling {sched:g}, "
            f"start-up {startup:g} s (the toy runtime); the simulator's executor paces stop "
            "and requeue delay as the daemon's (1 s observations, 1.5 s release delay)",
            "v1 (2026-12-06): submission delay 3.5 s (the replay's whole-second records on a "
            "loaded box), no completing",
        ),
    )


_SETS: tuple[CostSet, ...] = (
    # bench/resize_path.py --resizes 2 per release (docs/malleable.md): the requeue
    # path's wait for the backfill pass, and the fast path's phases
    _lab("22.05", 18.5, (1.1, 1.1, 4.1, 0.0, 2.3)),
    _lab("24.11", 21.0, (1.0, 1.0, 4.1, 0.0, 0.7)),
    _lab("26.05", 22.0, (1.0, 1.0, 3.6, 0.0, 0.6)),
    CostSet(
        name="replay-stand-in",
        version=2,
        about="the trace replay's stand-in job on the 22.05 site lab (cred_expire 10); "
        "scale by the replay's compression factor",
        checkpoint=Cost(1.38, _REPLAY, "22.05", _DAY, 2, "malleable set's resizes"),
        startup=replace(_CTLD_STARTUP, note="as its first start (a restart's not split out)"),
        first_startup=_CTLD_STARTUP,
        submit_delay=_CTLD_SUBMIT,
        requeue_delay=Cost(
            29.8,
            _RESIZE_PATH + " (Slurm's requeue path)",
            "22.05",
            _DAY,
            2,
            "cred_expire 10 + 1 s measured 11.3 s, then 18.5 s for the backfill pass",
        ),
        reform=_REFORM,
        completing=_COMPLETING,
        fast_path_s=7.1,
        notes=(
            "replay's resizes (malleable set, median of 2): checkpoint 1.4, stop 1.4, "
            "requeue delay 5.7, scheduling 0.0, total 7.9 s",
            "v1 (2026-12-06) took start-up 1.7 s and submission delay 3.5 s from the "
            "replay's own whole-second records on a loaded box, and no completing",
        ),
    ),
    CostSet(
        name="legacy",
        version=1,
        about="the simulator's constants before measurements (figures until 2026-12-06)",
        checkpoint=Cost(20.0, _NOT_MEASURED),
        startup=Cost(30.0, _NOT_MEASURED, note="the Pollux artifact's flat 30 s restart"),
        first_startup=Cost(0.0, _NOT_MEASURED, note="no per-job fixed cost"),
        submit_delay=Cost(0.0, _NOT_MEASURED, note="no per-job fixed cost"),
        requeue_delay=Cost(121.0, "Slurm's default cred_expire 120 + 1 s (slurm.conf)"),
        reform=Cost(10.0, _NOT_MEASURED),
        completing=Cost(0.0, _NOT_MEASURED, note="no per-job fixed cost"),
        fast_path_s=3.0,
        notes=("resize fast path: hold, update, release, 3 s (assumed)",),
    ),
)

COST_SETS: Mapping[str, CostSet] = {s.name: s for s in _SETS}
# Slurm 22.05 is the release SimSlurm models; its lab figures are the measured ones.
DEFAULT = "slurm-22.05-lab"


def cost_set(name: str) -> CostSet:
    """The named set; CostError (one line, the known names) for any other name."""
    try:
        return COST_SETS[name]
    except KeyError:
        raise CostError(
            f"unknown cost set {name!r}; known: {', '.join(COST_SETS)} (or a TOML file)"
        ) from None


def parse_costs(text: str, origin: str) -> CostSet:
    """A cost set from TOML ``text`` (``origin``: the file's name, for messages)::

        name = "our-site"          # default: origin
        version = 1
        about = "measured on our cluster"
        base = "slurm-22.05-lab"   # the costs left out come from here (default: DEFAULT)
        checkpoint = 12.0          # seconds, source: the file
        [startup]
        seconds = 45.0
        bench = "our restart log"
        release = "23.11"
        date = "2026-11-30"
        samples = 20

    Raises CostError with one line naming the file and what is wrong.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CostError(f"{origin}: not TOML: {exc}") from None
    known = {"name", "version", "about", "base", *COSTS}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise CostError(
            f"{origin}: unknown key {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    base_name = doc.get("base", DEFAULT)
    if not isinstance(base_name, str):
        raise CostError(f"{origin}: base must be a cost set's name, not {base_name!r}")
    try:
        base = cost_set(base_name)
    except CostError as exc:
        raise CostError(f"{origin}: base: {exc}") from None
    name = doc.get("name", origin)
    version = doc.get("version", 1)
    about = doc.get("about", f"read from {origin}")
    if not isinstance(name, str) or not name.strip():
        raise CostError(f"{origin}: name must be a non-empty string")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CostError(f"{origin}: version must be an integer >= 1, not {version!r}")
    if not isinstance(about, str):
        raise CostError(f"{origin}: about must be a string")
    costs: dict[str, Cost] = {}
    for key in COSTS:
        if key not in doc:
            costs[key] = _noted(base.cost(key), f"from {base.label}")
            continue
        costs[key] = _cost(doc[key], key, origin)
    return CostSet(
        name.strip(), version, about, **costs, fast_path_s=base.fast_path_s, notes=base.notes
    )


def _cost(value: object, key: str, origin: str) -> Cost:
    if not isinstance(value, dict):
        _check(key, value, origin)
        assert isinstance(value, int | float)
        return Cost(float(value), origin)
    unknown = sorted(set(value) - {"seconds", *_PROVENANCE})
    if unknown:
        raise CostError(
            f"{origin}: [{key}] has unknown key {', '.join(unknown)}; "
            f"known: seconds, {', '.join(_PROVENANCE)}"
        )
    if "seconds" not in value:
        raise CostError(f"{origin}: [{key}] needs seconds")
    seconds = value["seconds"]
    _check(key, seconds, origin)
    assert isinstance(seconds, int | float)
    fields: dict[str, str] = {}
    for k in ("bench", "release", "date", "note"):
        v = value.get(k, "")
        if isinstance(v, datetime.date):  # a bare TOML date
            v = v.isoformat()
        if not isinstance(v, str):
            raise CostError(f"{origin}: [{key}] {k} must be a string, not {v!r}")
        fields[k] = v
    samples = value.get("samples", 0)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise CostError(f"{origin}: [{key}] samples must be an integer >= 0, not {samples!r}")
    return Cost(
        float(seconds),
        fields["bench"] or origin,
        fields["release"],
        fields["date"],
        samples,
        fields["note"],
    )
