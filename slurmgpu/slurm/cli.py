"""``CliSlurmClient``: the SlurmClient backend that runs Slurm's own commands.

Listings are one ``squeue --json`` and one ``sinfo --json`` per call, decoded by
:mod:`slurmgpu.slurm.jsonformat` (``decode_squeue`` / ``decode_sinfo`` are re-exported
here). Finished jobs come from ``sacct --json`` (:meth:`CliSlurmClient.finished_jobs`,
decoded by :mod:`slurmgpu.slurm.sacct`). Actions use ``sbatch``, ``scontrol`` and
``scancel``. Every command goes through
:meth:`CliSlurmClient._run`: an argument list (never a shell), a timeout, and one place
that turns failures into :class:`SlurmUnavailableError` (timeout, controller not
answering, command missing) or :class:`SlurmCommandError` (Slurm refused; the message is
the first line of stderr).

``SLURM_CONF`` is read from the environment at each call unless ``slurm_conf`` is given.

A listing command that exits 0 but prints no document is never an empty cluster: Slurm
does that for ``sacct --json=vX`` when it lacks data_parser ``vX``, and squeue/sinfo
exit 1 with ``unable to find plugin: data_parser/vX`` on stderr (seen on 24.11 and
26.05). With ``data_parser=`` set, the client then falls back
to Slurm's default (plain ``--json``) with one warning; without it, or if the default
prints nothing too, the call raises :class:`SlurmParseError` with one line saying so.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Final

from slurmgpu.intent import Intent
from slurmgpu.model import Job, Node
from slurmgpu.slurm.client import (
    SlurmCommandError,
    SlurmError,
    SlurmParseError,
    SlurmUnavailableError,
)
from slurmgpu.slurm.jsonformat import JobMemo, decode_sinfo, decode_squeue
from slurmgpu.slurm.parse import SlurmValueError, format_time_limit
from slurmgpu.slurm.runner import CommandResult, CommandRunner, CommandTimeout, SubprocessRunner
from slurmgpu.slurm.sacct import decode_sacct
from slurmgpu.slurm.update import spelt_alike, update_fields

__all__ = [
    "CliSlurmClient",
    "decode_sacct",
    "decode_sinfo",
    "decode_squeue",
    "parse_version_output",
]

log = logging.getLogger("slurmgpu.slurm")

DEFAULT_TIMEOUT_S: Final = 30.0

# What Slurm's commands print when slurmctld (or munge) is not answering.
_UNAVAILABLE_RE: Final = re.compile(
    r"unable to contact slurm controller|connection refused|connect failure|"
    r"socket timed out|timed out|communication connection failure|zero bytes were transmitted|"
    r"transport endpoint|munge|authentication|credential|slurm_persist_conn|"
    r"backup controller|in standby mode|slurmctld.*(?:not responding|down)|"
    # 22.05 scontrol update/hold reports a failed connection this way:
    r"unexpected message received",
    re.IGNORECASE,
)
# sbatch --parsable prints "jobid" or "jobid;cluster".
_PARSABLE_RE: Final = re.compile(r"^\s*(\d+)(?:;(\S+))?\s*$")
# Job ids we pass on: 123, 123_4, 123_[1-3,5], 123+1 (hetjob component).
_JOB_ID_RE: Final = re.compile(r"\d+(?:_(?:\d+|\[[\d,\-%]+\]))?(?:\+\d+)?")
_UPDATE_KEY_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_SIGNAL_RE: Final = re.compile(r"(?:SIG)?[A-Z][A-Z0-9+]*|\d{1,2}", re.IGNORECASE)
_VERSION_RE: Final = re.compile(r"(\d+\.\d+\.\d+[\w.\-]*)")
# scancel -v lines for a job that is already over: cancelling it again is a no-op.
_ALREADY_DONE_RE: Final = re.compile(r"already completing or completed", re.IGNORECASE)
# What sacct prints (stderr, exit 1) under AccountingStorageType=accounting_storage/none.
_ACCOUNTING_DISABLED_RE: Final = re.compile(r"accounting storage is disabled", re.IGNORECASE)
_DATA_PARSER_RE: Final = re.compile(r"v\d+\.\d+\.\d+")
# What 24.11/26.05 squeue/sinfo/scontrol print (exit 1) for a --json=vX they lack;
# 22.05's take no argument at all.
_NO_PLUGIN_RE: Final = re.compile(
    r"unable to find plugin: data_parser/\S+|'--json' doesn't allow an argument"
)
# Job ids per sacct call: keeps the argument list and each answer small.
SACCT_CHUNK: Final = 200


def parse_version_output(text: str) -> str:
    """``"slurm 23.11.4"`` / ``"slurm-wlm 22.05.8"`` → ``"23.11.4"``."""
    m = _VERSION_RE.search(text)
    if not m:
        raise SlurmParseError(f"cannot find a Slurm version in {text.strip()[:80]!r}")
    return m.group(1)


def _first_line(*texts: bytes | str | None) -> str:
    for t in texts:
        if not t:
            continue
        s = t.decode("utf-8", "replace") if isinstance(t, bytes) else t
        for line in s.splitlines():
            if line.strip():
                return line.strip()
    return ""


def _job_id(job_id: str | int) -> str:
    text = str(job_id).strip()
    if isinstance(job_id, bool) or not _JOB_ID_RE.fullmatch(text):
        raise SlurmCommandError(f"invalid job id {str(job_id)[:40]!r}")
    return text


class CliSlurmClient:
    """SlurmClient over ``squeue``/``sinfo``/``sbatch``/``scontrol``/``scancel``.

    Args:
        timeout_s: seconds each command may take before the call raises
            :class:`SlurmUnavailableError` (the command is killed).
        slurm_conf: path for ``SLURM_CONF``; default: the environment's at call time.
        bin_dir: directory holding the Slurm commands; default: ``PATH``.
        all_states: add ``--states=all`` to squeue so jobs that finished within
            ``MinJobAge`` are listed too.
        data_parser: ask for this data_parser version (``"v0.0.42"``: ``--json=v0.0.42``)
            instead of Slurm's default; dropped (one warning) if this Slurm lacks it.
        runner: runs each command (:mod:`slurmgpu.slurm.runner`); default: subprocess.
    """

    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        slurm_conf: str | None = None,
        bin_dir: str | None = None,
        all_states: bool = True,
        data_parser: str | None = None,
        runner: CommandRunner | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
        if data_parser is not None and not _DATA_PARSER_RE.fullmatch(data_parser):
            raise ValueError(f"data_parser must look like 'v0.0.42', not {data_parser!r}")
        self.data_parser = data_parser
        self.timeout_s = timeout_s
        self.slurm_conf = slurm_conf
        self.bin_dir = bin_dir
        self.all_states = all_states
        self.runner: CommandRunner = runner if runner is not None else SubprocessRunner()
        self._version: str | None = None
        # The previous listing's jobs by their records' bytes: unchanged ones are not decoded again.
        self._memo: JobMemo = {}

    def __repr__(self) -> str:
        return f"CliSlurmClient(timeout_s={self.timeout_s!r}, slurm_conf={self.slurm_conf!r})"

    # ------------------------------------------------------------------ the one runner

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        if extra:
            env.update(extra)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def _run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        check: bool = True,
        big_output: bool = False,
    ) -> CommandResult:
        """Run one Slurm command (argument list, no shell); every call goes through here.

        Raises SlurmUnavailableError on timeout, a missing command, or when stderr says
        the controller did not answer; SlurmCommandError on any other non-zero exit
        (when ``check``), with stderr's first line. ``big_output`` asks the runner to hold
        stdout once (the subprocess runner reads it back from a temporary file), so a
        listing of hundreds of MiB is not kept as pipe chunks plus their join. The runner
        (``runner=``, default subprocess) only runs; all mapping to SlurmError is here.
        """
        args = list(argv)
        if self.bin_dir:
            args[0] = os.path.join(self.bin_dir, args[0])
        try:
            proc = self.runner(
                args,
                input=stdin,
                timeout=self.timeout_s,
                env=self._env(env),
                cwd=cwd,
                big_output=big_output,
            )
        except CommandTimeout:
            raise SlurmUnavailableError(
                f"{argv[0]} did not finish within {self.timeout_s:g} s"
            ) from None
        except FileNotFoundError as exc:
            if cwd and not os.path.isdir(cwd):
                raise SlurmCommandError(f"{argv[0]}: no such directory {cwd!r}") from None
            raise SlurmUnavailableError(f"{argv[0]}: command not found ({exc.strerror})") from None
        except PermissionError as exc:
            raise SlurmUnavailableError(f"{argv[0]}: cannot run: {exc.strerror}") from None
        except OSError as exc:
            raise SlurmError(f"{argv[0]}: cannot run: {exc}") from None
        if proc.returncode != 0 and check:
            raise self._failure(argv[0], proc)
        return proc

    @staticmethod
    def _failure(cmd: str, proc: CommandResult) -> SlurmError:
        line = _first_line(proc.stderr, proc.stdout) or f"exit status {proc.returncode}"
        msg = line if line.startswith(cmd) else f"{cmd}: {line}"
        err = proc.stderr.decode("utf-8", "replace") if proc.stderr else ""
        if _UNAVAILABLE_RE.search(err) or _UNAVAILABLE_RE.search(line):
            return SlurmUnavailableError(msg)
        return SlurmCommandError(msg, returncode=proc.returncode)

    def _json_flag(self) -> str:
        return f"--json={self.data_parser}" if self.data_parser else "--json"

    def _json_run(self, argv: Sequence[str]) -> CommandResult:
        """Run a ``--json`` command (``--json`` in ``argv`` stands for :meth:`_json_flag`).

        Exit 0 with nothing on stdout is Slurm lacking the data_parser asked for: drop
        back to its default once (and remember), else raise one clear line.
        """
        asked = self._json_flag()
        args = [asked if a == "--json" else a for a in argv]
        proc = self._run(args, check=False, big_output=True)
        if proc.stdout.strip():
            return proc
        err = proc.stderr.decode("utf-8", "replace") if proc.stderr else ""
        lacks_plugin = _NO_PLUGIN_RE.search(err)
        if proc.returncode != 0 and not lacks_plugin:
            return proc  # an ordinary failure: the caller says why
        why = _first_line(lacks_plugin.group(0) if lacks_plugin else "", proc.stderr)
        if self.data_parser is not None:
            log.warning(
                "%s %s printed nothing (exit %d%s): this Slurm lacks data_parser %s; "
                "using its default (--json) from now on",
                argv[0],
                asked,
                proc.returncode,
                f": {why}" if why else "",
                self.data_parser,
            )
            self.data_parser = None
            return self._json_run(argv)
        raise SlurmParseError(
            f"{argv[0]} {asked} exited 0 but printed no JSON document"
            f"{f' ({why})' if why else ''}; not reading that as an empty listing"
        )

    def _listing(self, argv: Sequence[str]) -> bytes:
        """Run a ``--json`` listing; a failing exit with JSON errors is decoded by the caller."""
        proc = self._json_run(argv)
        if proc.returncode == 0:
            return proc.stdout
        out = proc.stdout.lstrip()
        if out.startswith(b"{"):
            return proc.stdout  # Slurm's JSON "errors" say why; decode_* raises from them
        raise self._failure(argv[0], proc)

    # ------------------------------------------------------------------ listings

    def version(self) -> str:
        if self._version is None:
            proc = self._run(["sinfo", "--version"])
            self._version = parse_version_output(proc.stdout.decode("utf-8", "replace"))
        return self._version

    def jobs(self) -> list[Job]:
        argv = ["squeue", "--json", "--all"]
        if self.all_states:
            argv.append("--states=all")
        jobs, release = decode_squeue(self._listing(argv), self._memo)
        if release and self._version is None:
            self._version = release
        return jobs

    def job(self, job_id: int) -> Job | None:
        """One job as squeue shows it, None when Slurm lists no such job. ``--jobs`` has
        the controller send that job only (22.05's ``--json`` ignores the filter and
        sends them all, so the listing is filtered here too). A job the controller has
        forgotten may also come back as a :class:`SlurmError` (squeue's "Invalid job id
        specified"), depending on the release."""
        argv = ["squeue", "--json", "--all", f"--jobs={job_id}"]
        if self.all_states:
            argv.append("--states=all")
        jobs, _release = decode_squeue(self._listing(argv))  # not the poller's memo
        return next((j for j in jobs if j.job_id == job_id), None)

    def nodes(self) -> list[Node]:
        # --Node: on 23.11+ one "sinfo" record per node and partition (22.05 ignores it).
        return decode_sinfo(self._listing(["sinfo", "--json", "--Node"]))

    def finished_jobs(self, job_ids: Sequence[int]) -> list[Job]:
        """What accounting knows of ``job_ids``: the finished ones, newest run of each.

        One ``sacct --json --allusers -X -j ID,ID,...`` per 200 ids (``-j`` without
        ``--starttime`` searches from the epoch; ``-X`` leaves the steps out). Returns
        ``[]`` (and logs at debug level) when accounting storage is disabled.
        """
        wanted: dict[int, None] = {}  # ordered, without duplicates
        for job_id in job_ids:
            if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
                raise SlurmCommandError(f"invalid job id {str(job_id)[:40]!r}")
            wanted[job_id] = None
        ids = list(wanted)
        out: list[Job] = []
        for i in range(0, len(ids), SACCT_CHUNK):
            chunk = ids[i : i + SACCT_CHUNK]
            argv = ["sacct", "--json", "--allusers", "-X", "-j", ",".join(map(str, chunk))]
            proc = self._json_run(argv)
            if proc.returncode != 0:
                err = proc.stderr.decode("utf-8", "replace") if proc.stderr else ""
                if _ACCOUNTING_DISABLED_RE.search(err):
                    log.debug("sacct: Slurm accounting storage is disabled; no finished jobs")
                    return []
                if not proc.stdout.lstrip().startswith(b"{"):
                    raise self._failure("sacct", proc)
            jobs, release = decode_sacct(proc.stdout)
            if release and self._version is None:
                self._version = release
            keep = set(chunk)
            out.extend(j for j in jobs if j.job_id in keep and j.state.is_terminal)
        return out

    # ------------------------------------------------------------------ actions

    def submit(
        self,
        sbatch_args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> int:
        """``sbatch --parsable ARGS``; ``env`` is added to this process's environment."""
        args = [str(a) for a in sbatch_args]
        proc = self._run(["sbatch", "--parsable", *args], stdin=stdin, env=env, cwd=cwd)
        out = proc.stdout.decode("utf-8", "replace")
        for line in out.splitlines():
            m = _PARSABLE_RE.match(line)
            if m:
                return int(m.group(1))
        raise SlurmParseError(f"sbatch --parsable printed no job id: {out.strip()[:80]!r}")

    def update_job(self, job_id: str | int, intents: Sequence[Intent]) -> None:
        """The intents as this cluster's release spells them (the GRES of 22.05 differs;
        the release is asked for only then)."""
        if not intents:
            raise SlurmCommandError("scontrol update: no fields to update")
        try:
            fields = update_fields(intents, "" if spelt_alike(intents) else self.version())
        except SlurmValueError as exc:
            raise SlurmCommandError(f"scontrol update: {exc}") from None
        self._update(job_id, fields)

    def _update(self, job_id: str | int, fields: Mapping[str, str]) -> None:
        jid = _job_id(job_id)
        if not fields:
            raise SlurmCommandError("scontrol update: no fields to update")
        pairs = []
        for key, value in fields.items():
            if not _UPDATE_KEY_RE.fullmatch(key):
                raise SlurmCommandError(f"scontrol update: invalid field name {key!r}")
            text = str(value)
            if "\n" in text or "\0" in text:
                raise SlurmCommandError(f"scontrol update: invalid value for {key}")
            pairs.append(f"{key}={text}")
        self._run(["scontrol", "update", f"JobId={jid}", *pairs])

    def hold(self, job_id: str | int) -> None:
        self._run(["scontrol", "hold", _job_id(job_id)])

    def release(self, job_id: str | int) -> None:
        self._run(["scontrol", "release", _job_id(job_id)])

    def requeue(self, job_id: str | int, *, hold: bool = False) -> None:
        self._run(["scontrol", "requeuehold" if hold else "requeue", _job_id(job_id)])

    def signal(self, job_id: str | int, signal: str, *, batch_only: bool = False) -> None:
        sig = str(signal).strip()
        if not _SIGNAL_RE.fullmatch(sig):
            raise SlurmCommandError(f"scancel: invalid signal {sig[:20]!r}")
        argv = ["scancel", f"--signal={sig}"]
        if batch_only:
            argv.append("--batch")
        argv.append(_job_id(job_id))
        self._scancel(argv)

    def signal_all(self, job_id: str | int, signal: str) -> None:
        """``scancel --full --signal=SIG J``: the batch script, its children and all steps."""
        sig = str(signal).strip()
        if not _SIGNAL_RE.fullmatch(sig):
            raise SlurmCommandError(f"scancel: invalid signal {sig[:20]!r}")
        self._scancel(["scancel", f"--signal={sig}", "--full", _job_id(job_id)])

    def cancel(self, job_id: str | int) -> None:
        """``scancel``; a job that already ended is not an error (it is cancelled)."""
        self._scancel(["scancel", _job_id(job_id)], ok_if_done=True)

    def _scancel(self, argv: list[str], *, ok_if_done: bool = False) -> None:
        # scancel exits 0 (and prints nothing) for an unknown job id unless --verbose,
        # so run it verbose and read its "error:" lines.
        proc = self._run([argv[0], "--verbose", *argv[1:]], check=False)
        err = proc.stderr.decode("utf-8", "replace")
        errors = [ln.strip() for ln in err.splitlines() if "error:" in ln]
        if ok_if_done:
            errors = [ln for ln in errors if not _ALREADY_DONE_RE.search(ln)]
        if errors:
            line = errors[0]
            msg = line if line.startswith("scancel") else f"scancel: {line}"
            if _UNAVAILABLE_RE.search(line):
                raise SlurmUnavailableError(msg)
            raise SlurmCommandError(msg, returncode=proc.returncode)
        if proc.returncode != 0 and not ok_if_done:
            raise self._failure("scancel", proc)

    def set_array_throttle(self, array_job_id: int, max_running: int) -> None:
        if isinstance(max_running, bool) or int(max_running) < 0:
            raise SlurmCommandError(f"invalid array throttle {max_running!r}")
        self._update(array_job_id, {"ArrayTaskThrottle": str(int(max_running))})

    def set_time_limit(self, job_id: str | int, limit: timedelta) -> None:
        try:
            text = format_time_limit(limit)
        except SlurmValueError as exc:
            raise SlurmCommandError(str(exc)) from None
        self._update(job_id, {"TimeLimit": text})
