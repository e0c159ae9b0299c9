"""``PySlurmClient``: the SlurmClient backend over pyslurm (Slurm's C API), optional.

Written against pyslurm 25.11's object API: ``pyslurm.Jobs.load()`` (a collection whose
``values()`` are ``pyslurm.Job``), ``pyslurm.Nodes.load()``, ``Job(id).hold()``,
``.release()``, ``.requeue(hold=)``, ``.send_signal(sig, steps=)``, ``.cancel()``,
``.modify(JobSubmitDescription(time_limit=...))`` and ``pyslurm.RPCError``.

Each pyslurm record is turned into the same intermediate record the JSON backend
decodes (:class:`~slurmgpu.slurm.jsonformat.JobRecord` / ``NodeRecord``) and normalised
by the same code, so both backends produce identical :class:`~slurmgpu.model.Job` values
wherever pyslurm exposes the data. Limits of pyslurm's API, documented rather than
guessed around:

* pyslurm exposes ``gres_per_node`` but not ``tres_per_job``/``tres_per_task``/
  ``tres_per_socket`` nor the TRES strings; when it has none of them, a running job's
  GPU request falls back to what its per-node GRES layout shows allocated, and a pending
  ``--gpus=N`` / ``--gpus-per-task`` job shows no GPU request.
* Submitting (``sbatch`` arguments), ``update_job`` (typed intents, spelt as
  ``scontrol update`` fields for the cluster's release) and ``set_array_throttle`` go
  through the CLI backend.
* C API calls cannot be interrupted: Slurm's own ``MessageTimeout`` applies, not
  ``timeout_s`` (which the CLI fallback uses).

pyslurm is imported lazily, so this module imports fine without it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from types import ModuleType
from typing import Any, TypeVar

from slurmgpu.intent import Intent
from slurmgpu.model import Job, Node
from slurmgpu.slurm.cli import DEFAULT_TIMEOUT_S, CliSlurmClient
from slurmgpu.slurm.client import (
    SlurmCommandError,
    SlurmError,
    SlurmParseError,
    SlurmUnavailableError,
)
from slurmgpu.slurm.jsonformat import (
    ExitCode,
    ExitSignal,
    JobRecord,
    NodeRecord,
    _Problems,
    job_from_record,
    node_from_record,
)
from slurmgpu.slurm.parse import SlurmValueError, expand_hostlist, format_time_limit

__all__ = ["PySlurmClient", "PySlurmUnavailableError", "import_pyslurm"]

_T = TypeVar("_T")

_UNAVAILABLE_RE = re.compile(
    r"contact slurm controller|connect|timed? ?out|munge|authenticat|communication|socket|"
    r"transmitted|unexpected message",
    re.IGNORECASE,
)


class PySlurmUnavailableError(SlurmError):
    """pyslurm is not installed (or does not import) in this Python."""


def import_pyslurm() -> ModuleType:
    """Import pyslurm or raise :class:`PySlurmUnavailableError` saying why."""
    try:
        return importlib.import_module("pyslurm")
    except Exception as exc:  # ImportError, or a libslurm load failure inside it
        raise PySlurmUnavailableError(
            f"pyslurm is not available: {type(exc).__name__}: {exc}"
        ) from None


def _attr(obj: object, names: Sequence[str], typ: type[_T]) -> _T | None:
    """The first of ``names`` that ``obj`` has with a value of type ``typ``."""
    for name in names:
        try:
            value = getattr(obj, name)
        except Exception:  # pyslurm properties may raise for odd records
            value = None
        if isinstance(value, typ) and not (typ is int and isinstance(value, bool)):
            return value
    return None


def _gres_string(gres: object, *, prefix: str = "", with_index: bool = False) -> str:
    """pyslurm's ``to_gres_dict`` result back into Slurm's GRES text."""
    if not isinstance(gres, Mapping):
        return ""
    parts: list[str] = []
    for key, value in gres.items():
        if isinstance(value, Mapping):
            count = value.get("count")
            idx = value.get("indexes")
            if not isinstance(count, int):
                continue
            text = f"{prefix}{key}:{count}"
            if with_index and isinstance(idx, str) and idx:
                text += f"(IDX:{idx})"
            parts.append(text)
        elif isinstance(value, int) and not isinstance(value, bool):
            parts.append(f"{prefix}{key}:{value}")
    return ",".join(parts)


class PySlurmClient:
    """SlurmClient over pyslurm; see the module docstring for what it delegates."""

    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        slurm_conf: str | None = None,
        module: ModuleType | None = None,
    ) -> None:
        self._pyslurm: Any = module if module is not None else import_pyslurm()
        self._cli = CliSlurmClient(timeout_s=timeout_s, slurm_conf=slurm_conf)

    def __repr__(self) -> str:
        return f"PySlurmClient(pyslurm={self.pyslurm_version!r})"

    @property
    def pyslurm_version(self) -> str:
        v = getattr(self._pyslurm, "__version__", "")
        return v if isinstance(v, str) else ""

    # ------------------------------------------------------------------ errors

    def _call(self, what: str, fn: Callable[[], _T]) -> _T:
        rpc_error = getattr(self._pyslurm, "RPCError", None)
        try:
            return fn()
        except SlurmError:
            raise
        except Exception as exc:
            if isinstance(rpc_error, type) and isinstance(exc, rpc_error):
                msg = f"{what}: {exc}"
                if _UNAVAILABLE_RE.search(str(exc)):
                    raise SlurmUnavailableError(msg) from None
                raise SlurmCommandError(msg, returncode=getattr(exc, "errno", None)) from None
            raise SlurmError(f"{what}: {type(exc).__name__}: {exc}") from None

    # ------------------------------------------------------------------ listings

    def version(self) -> str:
        return self._cli.version()

    def jobs(self) -> list[Job]:
        loaded = self._call("pyslurm.Jobs.load", self._pyslurm.Jobs.load)
        problems = _Problems()
        out: list[Job] = []
        for pj in loaded.values():
            try:
                out.append(job_from_record(self._job_record(pj), problems))
            except (TypeError, ValueError, AttributeError) as exc:
                raise SlurmParseError(f"pyslurm job {getattr(pj, 'id', '?')}: {exc}") from None
        problems.log("pyslurm jobs")
        return out

    def nodes(self) -> list[Node]:
        loaded = self._call("pyslurm.Nodes.load", self._pyslurm.Nodes.load)
        problems = _Problems()
        out: list[Node] = []
        for pn in loaded.values():
            try:
                out.append(node_from_record(self._node_record(pn), problems))
            except (TypeError, ValueError, AttributeError) as exc:
                name = getattr(pn, "name", "?")
                raise SlurmParseError(f"pyslurm node {name}: {exc}") from None
        problems.log("pyslurm nodes")
        return out

    @staticmethod
    def _job_record(j: object) -> JobRecord:
        job_id = _attr(j, ("id", "job_id"), int)
        if job_id is None:
            raise ValueError("no job id")
        nodes = _attr(j, ("allocated_nodes", "nodes"), str) or ""
        parallel = _attr(j, ("array_tasks_parallel",), int)
        waiting = _attr(j, ("array_tasks_waiting",), str)
        task_string = (f"{waiting}%{parallel}" if parallel else waiting) if waiting else ""

        per_node = _gres_string(getattr(j, "gres_per_node", None), prefix="gres/")
        per_job = _attr(j, ("tres_per_job",), str) or ""
        per_task = _attr(j, ("tres_per_task",), str) or ""
        per_socket = _attr(j, ("tres_per_socket",), str) or ""
        for attr, current in (("gpus", per_job), ("gpus_per_task", per_task)):
            n = _attr(j, (attr,), int)
            if n and not current:
                if attr == "gpus":
                    per_job = f"gres/gpu:{n}"
                else:
                    per_task = f"gres/gpu:{n}"

        gres_detail: list[str] = []
        layout_fn = getattr(j, "get_resource_layout_per_node", None)
        if nodes and callable(layout_fn):
            try:
                layout = layout_fn()
            except Exception:
                layout = None
            if isinstance(layout, Mapping):
                try:
                    hosts: Iterable[str] = expand_hostlist(nodes)
                except SlurmValueError:
                    hosts = list(layout)
                for host in hosts:
                    entry = layout.get(host)
                    gres = entry.get("gres") if isinstance(entry, Mapping) else None
                    gres_detail.append(_gres_string(gres, with_index=True))

        ec = _attr(j, ("exit_code",), int)
        sig = _attr(j, ("exit_code_signal",), int)
        exit_code = ExitCode(return_code=ec, signal=ExitSignal(id=sig)) if ec is not None else None
        return JobRecord(
            job_id=job_id,
            name=_attr(j, ("name",), str),
            user_name=_attr(j, ("user_name",), str),
            user_id=_attr(j, ("user_id",), int),
            account=_attr(j, ("account",), str),
            partition=_attr(j, ("partition",), str),
            qos=_attr(j, ("qos",), str),
            job_state=_attr(j, ("state",), str),
            state_reason=_attr(j, ("state_reason",), str),
            array_job_id=_attr(j, ("array_id", "array_job_id"), int),
            array_task_id=_attr(j, ("array_task_id",), int),
            array_task_string=task_string,
            array_max_tasks=parallel,
            submit_time=_attr(j, ("submit_time",), int),
            eligible_time=_attr(j, ("eligible_time",), int),
            start_time=_attr(j, ("start_time",), int),
            end_time=_attr(j, ("end_time",), int),
            time_limit=_attr(j, ("time_limit",), int),
            cpus=_attr(j, ("cpus",), int),
            node_count=_attr(j, ("num_nodes",), int),
            tasks=_attr(j, ("ntasks", "num_tasks"), int),
            memory_per_node=_attr(j, ("memory_per_node",), int),
            memory_per_cpu=_attr(j, ("memory_per_cpu",), int),
            sockets_per_node=_attr(j, ("sockets_per_node",), int),
            tres_per_node=per_node,
            tres_per_job=per_job,
            tres_per_task=per_task,
            tres_per_socket=per_socket,
            nodes=nodes,
            gres_detail=gres_detail,
            restart_cnt=_attr(j, ("requeue_count", "restart_count"), int),
            priority=_attr(j, ("priority",), int),
            requeue=_attr(j, ("is_requeueable",), bool),
            comment=_attr(j, ("comment",), str),
            admin_comment=_attr(j, ("admin_comment",), str),
            current_working_directory=_attr(j, ("working_directory",), str),
            command=_attr(j, ("command",), str),
            exit_code=exit_code,
            batch_flag=_attr(j, ("is_batch_job",), bool),
        )

    @staticmethod
    def _node_record(n: object) -> NodeRecord:
        name = _attr(n, ("name",), str)
        if not name:
            raise ValueError("no node name")
        parts = getattr(n, "partitions", None)
        partitions = [p for p in parts if isinstance(p, str)] if isinstance(parts, list) else None
        return NodeRecord(
            name=name,
            state=_attr(n, ("state",), str),
            cpus=_attr(n, ("total_cpus", "cpus"), int),
            alloc_cpus=_attr(n, ("allocated_cpus", "alloc_cpus"), int),
            real_memory=_attr(n, ("real_memory", "real_memory_raw"), int),
            alloc_memory=_attr(n, ("allocated_memory", "alloc_memory_raw"), int),
            gres=_gres_string(_attr(n, ("configured_gres", "gres"), dict)),
            gres_used=_gres_string(
                _attr(n, ("allocated_gres", "alloc_gres"), dict), with_index=True
            ),
            partitions=partitions,
            reason=_attr(n, ("reason",), str),
            address=_attr(n, ("address",), str),
        )

    # ------------------------------------------------------------------ actions

    def _job(self, job_id: str | int) -> Any:
        text = str(job_id).strip()
        if isinstance(job_id, bool) or not text.isdigit():
            # Array tasks ("12_3") and hetjob components have no pyslurm.Job handle.
            return None
        return self._pyslurm.Job(int(text))

    def submit(
        self,
        sbatch_args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> int:
        return self._cli.submit(sbatch_args, env=env, cwd=cwd, stdin=stdin)

    def update_job(self, job_id: str | int, intents: Sequence[Intent]) -> None:
        self._cli.update_job(job_id, intents)

    def hold(self, job_id: str | int) -> None:
        job = self._job(job_id)
        if job is None:
            self._cli.hold(job_id)
        else:
            self._call(f"hold {job_id}", job.hold)

    def release(self, job_id: str | int) -> None:
        job = self._job(job_id)
        if job is None:
            self._cli.release(job_id)
        else:
            self._call(f"release {job_id}", job.release)

    def requeue(self, job_id: str | int, *, hold: bool = False) -> None:
        job = self._job(job_id)
        if job is None:
            self._cli.requeue(job_id, hold=hold)
        else:
            self._call(f"requeue {job_id}", lambda: job.requeue(hold=hold))

    def signal(self, job_id: str | int, signal: str, *, batch_only: bool = False) -> None:
        job = self._job(job_id)
        if job is None:
            self._cli.signal(job_id, signal, batch_only=batch_only)
            return
        steps = "batch" if batch_only else "children"
        self._call(f"signal {job_id}", lambda: job.send_signal(signal, steps=steps))

    def signal_all(self, job_id: str | int, signal: str) -> None:
        self._cli.signal_all(job_id, signal)  # pyslurm has no "full" (batch + steps) mode

    def cancel(self, job_id: str | int) -> None:
        job = self._job(job_id)
        if job is None:
            self._cli.cancel(job_id)
        else:
            self._call(f"cancel {job_id}", job.cancel)

    def set_array_throttle(self, array_job_id: int, max_running: int) -> None:
        self._cli.set_array_throttle(array_job_id, max_running)

    def set_time_limit(self, job_id: str | int, limit: timedelta) -> None:
        job = self._job(job_id)
        if job is None:
            self._cli.set_time_limit(job_id, limit)
            return
        try:
            text = format_time_limit(limit)
        except SlurmValueError as exc:
            raise SlurmCommandError(str(exc)) from None
        desc_cls = self._pyslurm.JobSubmitDescription
        self._call(f"set time limit of {job_id}", lambda: job.modify(desc_cls(time_limit=text)))
