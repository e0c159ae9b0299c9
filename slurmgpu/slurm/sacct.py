"""Decode ``sacct --json`` (Slurm 22.05 … 24.11) into :class:`slurmgpu.model.Job` objects.

Pure functions, no subprocess: :func:`decode_sacct` is what
``CliSlurmClient.finished_jobs`` and the tests call. The helpers and the ``meta`` /
``errors`` / exit-code schemas are shared with :mod:`slurmgpu.slurm.jsonformat`.

Versions covered (the ``JOB`` record of the accounting database, ``slurmdb_job_rec_t``):

* 22.05 (``meta.plugin.type = "openapi/dbv0.0.38"``): plain integers, ``null`` for
  unset/infinite (``time.limit`` ``null`` = no limit), ``state.current`` a string,
  ``exit_code`` ``{"status": "SUCCESS" | "SIGNALED" | …, "return_code": n}`` with a
  ``signal`` ``{"signal_id", "name"}`` when signalled. Its dumper writes *every* normal
  exit as ``"SUCCESS"`` / ``0`` (it never reads the real status; ``sacct`` prints ``3:0``
  for the same record), so a v0.0.38 ``"SUCCESS"`` is only believed for a COMPLETED job:
  a FAILED job gets ``exit_code=None`` (unknown) rather than a wrong 0. Requeued jobs are
  listed once per run (the older runs ``REQUEUED``), oldest first.
* 23.02 … 24.11 (``meta.plugin.data_parser`` ``v0.0.39`` … ``v0.0.42``): no-val numbers
  are ``{"set", "infinite", "number"}`` (``time.limit``, ``array.task_id``,
  ``exit_code.return_code``, ``exit_code.signal.id``), times plain epoch seconds,
  ``state.current`` a list (``["COMPLETED"]``), ``exit_code.status`` a list
  (``["ERROR"]``) with the real return code, and ``restart_cnt``.

Both list ``tres.requested`` / ``tres.allocated`` as ``[{"type", "name", "id", "count"}]``
(``mem`` in MiB, GPUs as ``type = "gres"``, ``name = "gpu"`` or ``"gpu:a100"``).

Normalisation (fields sacct does not know keep the model's defaults):

* one Job per job id: the newest record (latest submission, then the later in the list)
  when a requeued job is listed several times; ``restart_count`` is ``restart_cnt`` when
  given, else the number of older records of that job id in the document.
* ``cpus`` / ``memory_mib`` / ``node_count`` from ``tres.allocated``, else
  ``tres.requested`` (memory), ``required.CPUs`` and ``allocation_nodes``.
* ``gpus`` from the ``gres`` TRES (allocated, else requested): the untyped ``gpu`` entry,
  else the sum of typed ``gpu:TYPE`` entries; shards likewise. No per-GPU indices
  (``gpu_allocations`` stays empty: sacct does not record them).
* ``"None assigned"`` nodes (a job that never ran) → no nodes.

A wrong *shape* raises :class:`SlurmParseError` (with msgspec's path); a document that
holds only Slurm's ``errors`` raises :class:`SlurmUnavailableError` /
:class:`SlurmCommandError` as for squeue, except "nothing found" (error 9003,
``ESLURM_REST_EMPTY_RESULT``), which is an empty answer.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from slurmgpu.model import GpuRequest, Job, JobState
from slurmgpu.slurm.client import SlurmParseError
from slurmgpu.slurm.jsonformat import (
    ErrorItem,
    ExitCode,
    IntLike,
    Meta,
    Num,
    _decode_lenient,
    _errors_to_exception,
    _gc_paused,
    _job_state,
    _minutes,
    _note_version,
    _num,
    _pos,
    _Problems,
    _records,
    _release,
    _Skipped,
    _sniff_version,
    _str,
    _time,
    _version_hint,
)
from slurmgpu.slurm.parse import SlurmValueError, expand_hostlist

__all__ = ["SacctDocument", "SacctJobRecord", "decode_sacct", "job_from_sacct_record"]

# ESLURM_REST_EMPTY_RESULT: 22.05 reports "Nothing found with query" as an error.
_NOTHING_FOUND: Final = frozenset({9003})
_NOTHING_FOUND_RE: Final = re.compile(r"nothing found", re.IGNORECASE)

# --------------------------------------------------------------------------- schemas


class SacctTime(msgspec.Struct, gc=False):
    elapsed: IntLike = None
    eligible: IntLike = None
    end: IntLike = None
    start: IntLike = None
    submission: IntLike = None
    suspended: IntLike = None
    limit: IntLike = None  # minutes


class SacctArray(msgspec.Struct, gc=False):
    job_id: IntLike = None
    task_id: IntLike = None
    task: str | None = None


class SacctState(msgspec.Struct, gc=False):
    current: str | list[str] | None = None
    reason: str | None = None


class SacctTres(msgspec.Struct, gc=False):
    type: str | None = None
    name: str | None = None
    count: IntLike = None


class SacctTresSet(msgspec.Struct, gc=False):
    requested: list[SacctTres] | None = None
    allocated: list[SacctTres] | None = None


class SacctRequired(msgspec.Struct, gc=False):
    cpus: IntLike = msgspec.field(default=None, name="CPUs")
    memory: IntLike = None  # v0.0.38 (MiB; per node or per CPU, not said)
    memory_per_cpu: IntLike = None
    memory_per_node: IntLike = None


class SacctComment(msgspec.Struct, gc=False):
    administrator: str | None = None
    job: str | None = None
    system: str | None = None


class SacctJobRecord(msgspec.Struct, gc=False):
    """The fields of one ``sacct --json`` job record that slurmgpu reads (all versions)."""

    job_id: int | Num
    name: str | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    state: SacctState | None = None
    time: SacctTime | None = None
    array: SacctArray | None = None
    exit_code: int | ExitCode | None = None
    nodes: str | None = None
    allocation_nodes: IntLike = None
    tres: SacctTresSet | None = None
    required: SacctRequired | None = None
    comment: SacctComment | None = None
    restart_cnt: IntLike = None
    working_directory: str | None = None


class SacctDocument(msgspec.Struct, gc=False):
    meta: Meta | None = None
    errors: list[ErrorItem | str] | None = None
    jobs: list[SacctJobRecord] | None = None


class _RawSacctDocument(msgspec.Struct, gc=False):
    meta: Meta | None = None
    errors: list[ErrorItem | str] | None = None
    jobs: list[msgspec.Raw] | None = None


_SACCT_DECODER: Final = msgspec.json.Decoder(SacctDocument)
_RAW_SACCT_DECODER: Final = msgspec.json.Decoder(_RawSacctDocument)
_SACCT_RECORD_DECODER: Final = msgspec.json.Decoder(SacctJobRecord)

# --------------------------------------------------------------------------- helpers


def _tres_counts(items: list[SacctTres] | None) -> dict[str, int]:
    """``{"cpu": 2, "mem": 512, "node": 1, "gres/gpu": 2, "gres/gpu:a100": 2}``."""
    out: dict[str, int] = {}
    for t in items or ():
        kind = (t.type or "").strip().lower()
        if not kind:
            continue
        count = _num(t.count)
        if count is None or count < 0:
            continue
        key = f"{kind}/{t.name.strip()}" if t.name else kind
        out[key] = out.get(key, 0) + count
    return out


def _gres_total(counts: dict[str, int], name: str) -> tuple[int | None, str | None]:
    """Total of ``gres/NAME`` (untyped entry, else the typed ones) and the single type."""
    typed = {
        k[len(f"gres/{name}:") :]: v for k, v in counts.items() if k.startswith(f"gres/{name}:")
    }
    gpu_type = next(iter(typed)) if len(typed) == 1 else None
    untyped = counts.get(f"gres/{name}")
    if untyped is not None:
        return untyped, gpu_type
    if typed:
        return sum(typed.values()), gpu_type
    return None, None


def _gpu_request(alloc: dict[str, int], req: dict[str, int]) -> GpuRequest:
    for source, counts in (("tres_alloc_str", alloc), ("tres_req_str", req)):
        gpus, gpu_type = _gres_total(counts, "gpu")
        shards, _ = _gres_total(counts, "shard")
        if gpus or shards:
            return GpuRequest(
                gpus=gpus or 0, gpu_type=gpu_type, shards=shards or 0, sources=(source,)
            )
    return GpuRequest()


def _exit_code_from(v: int | ExitCode | None, state: JobState, buggy_v38: bool) -> int | None:
    """Shell-style exit code (status, or 128 + signal); see the module docstring."""
    if v is None or state is JobState.PENDING:
        return None
    if type(v) is int:
        if v & 0x7F:
            return 128 + (v & 0x7F)
        return (v >> 8) & 0xFF
    if not isinstance(v, ExitCode):
        return None
    if v.signal is not None:
        sig = _num(v.signal.id) if v.signal.id is not None else _num(v.signal.signal_id)
        if sig:
            return 128 + sig
    statuses = [v.status] if isinstance(v.status, str) else list(v.status or ())
    statuses = [s.upper() for s in statuses]
    if "PENDING" in statuses:
        return None
    code = _num(v.return_code)
    if buggy_v38 and code == 0 and "SUCCESS" in statuses and state is not JobState.COMPLETED:
        return None  # 22.05 writes every normal exit as SUCCESS/0
    return code


def job_from_sacct_record(
    r: SacctJobRecord,
    problems: _Problems | None = None,
    *,
    buggy_v38: bool = False,
    restarts: int = 0,
) -> Job:
    """Normalise one decoded ``sacct`` job record (see the module docstring)."""
    if problems is None:
        problems = _Problems()
    job_id = _num(r.job_id)
    if job_id is None:
        raise SlurmParseError("sacct job record without a job_id")
    st = r.state or SacctState()
    state, flags = _job_state(st.current, problems)
    t = r.time or SacctTime()
    arr = r.array or SacctArray()
    tres = r.tres or SacctTresSet()
    alloc = _tres_counts(tres.allocated)
    req = _tres_counts(tres.requested)
    required = r.required or SacctRequired()

    hosts: tuple[str, ...] = ()
    nodes_text = (r.nodes or "").strip()
    if nodes_text and nodes_text.lower() != "none assigned":
        try:
            hosts = expand_hostlist(nodes_text)
        except SlurmValueError as exc:
            problems.add(f"sacct job {job_id} nodes", exc)

    cpus = alloc.get("cpu") or _num(required.cpus) or 0
    memory = alloc.get("mem") or req.get("mem")
    node_count = alloc.get("node") or _num(r.allocation_nodes) or len(hosts)
    reason = st.reason
    comment = r.comment or SacctComment()
    restart_cnt = _num(r.restart_cnt)
    return Job(
        job_id=job_id,
        name=_str(r.name),
        user=_str(r.user),
        state=state,
        account=_str(r.account),
        partition=_str(r.partition),
        qos=_str(r.qos),
        state_flags=flags,
        reason="" if not reason or reason == "None" else reason,
        array_job_id=_pos(arr.job_id),
        array_task_id=_num(arr.task_id),
        array_task_spec=arr.task or None,
        submit_time=_time(t.submission),
        eligible_time=_time(t.eligible),
        start_time=_time(t.start),
        end_time=_time(t.end),
        time_limit=_minutes(t.limit),
        cpus=cpus,
        memory_mib=memory or None,
        node_count=node_count,
        gpus=_gpu_request(alloc, req),
        nodes=hosts,
        restart_count=restart_cnt if restart_cnt is not None else restarts,
        comment=_str(comment.job),
        admin_comment=_str(comment.administrator),
        work_dir=_str(r.working_directory),
        exit_code=_exit_code_from(r.exit_code, state, buggy_v38),
    )


def _nothing_found(errors: list[ErrorItem | str]) -> bool:
    for e in errors:
        if isinstance(e, str):
            if not _NOTHING_FOUND_RE.search(e):
                return False
            continue
        code = _num(e.error_number) if e.error_number is not None else _num(e.errno)
        text = " ".join(p for p in (e.description, e.error) if p)
        if code not in _NOTHING_FOUND and not _NOTHING_FOUND_RE.search(text):
            return False
    return True


def decode_sacct(data: bytes | str) -> tuple[list[Job], str]:
    """Decode ``sacct --json`` output into jobs (one per job id) and the Slurm release.

    Jobs come in the order of their newest record. Raises :class:`SlurmParseError` for
    malformed JSON or an unexpected shape, and :class:`SlurmUnavailableError` /
    :class:`SlurmCommandError` when Slurm answered only with ``errors`` (other than
    "nothing found", which gives ``[]``).
    """
    what = "sacct --json"
    decoded = _decode_lenient(_SACCT_DECODER, _RAW_SACCT_DECODER, data, what)
    doc, raw_doc, data = decoded
    skipped = _Skipped()
    records: list[SacctJobRecord] | None
    if doc is None:
        assert raw_doc is not None
        meta, errors = raw_doc.meta, raw_doc.errors
        records = _records(raw_doc.jobs, _SACCT_RECORD_DECODER, "$.jobs", skipped, data)
    else:
        meta, errors, records = doc.meta, doc.errors, doc.jobs
    _note_version(meta, what)
    if errors and not records and not skipped.count:
        if _nothing_found(errors):
            return [], _release(meta)
        raise _errors_to_exception(errors, "sacct")
    if records is None:
        raise SlurmParseError(f"{what}: no 'jobs' list in the output{_version_hint(data)}")
    buggy_v38 = (_sniff_version(data) or "v0.0.38") == "v0.0.38"
    newest: dict[int, tuple[int, int, SacctJobRecord]] = {}
    seen: dict[int, int] = {}
    with _gc_paused():
        for i, r in enumerate(records):
            job_id = _num(r.job_id)
            if job_id is None:
                skipped.add(f"$.jobs[{i}].job_id{_version_hint(data)}", "no job id number")
                continue
            seen[job_id] = seen.get(job_id, 0) + 1
            submitted = _num(r.time.submission) if r.time is not None else None
            key = (submitted or 0, i)
            old = newest.get(job_id)
            if old is None or key >= old[:2]:
                newest[job_id] = (key[0], key[1], r)
        problems = _Problems()
        ordered = sorted(newest.items(), key=lambda item: item[1][1])
        jobs: list[Job] = []
        for job_id, (_, _, r) in ordered:
            try:
                jobs.append(
                    job_from_sacct_record(
                        r, problems, buggy_v38=buggy_v38, restarts=seen[job_id] - 1
                    )
                )
            except (SlurmParseError, ValueError, TypeError, ArithmeticError) as exc:
                skipped.add(f"job {job_id}", exc)
    problems.log(what)
    skipped.log(what)
    return jobs, _release(meta)
