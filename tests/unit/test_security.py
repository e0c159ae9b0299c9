"""Security properties: who may see what, what files others can read, how commands run.

The status API's authorisation is tested here with a test authenticator that maps a
header to a uid (munged is not running in the unit suite); tests/slurm/test_security_real.py
repeats it with real MUNGE credentials of root and of an unprivileged user.
"""

from __future__ import annotations

import ast
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurmgpu.agent.spool import BatchSpool
from slurmgpu.config import DaemonSettings, parse_settings
from slurmgpu.daemon.auth import Authenticator
from slurmgpu.daemon.ingest import IngestService
from slurmgpu.daemon.node_directory import NodeDirectory
from slurmgpu.listen_address import parse_listen
from slurmgpu.model import ClusterSnapshot, GpuRequest, Job, JobState, Node
from slurmgpu.store import JobStore, open_store
from slurmgpu.store.audit import AuditStore
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import AuthError, Caller, hmac_header, node_token
from tests.source_tree import parsed, python_files, source

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "slurmgpu"
SECRET = b"k" * 64


# --------------------------------------------------------------------------- status API


@dataclass
class HeaderUidAuth(Authenticator):
    """``Test uid=N`` proves uid N (the real one asks unmunge)."""

    def authenticate_user(self, header: str | None) -> Caller:
        m = re.fullmatch(r"Test uid=(\d+)", header or "")
        if not m:
            return super().authenticate_user(header)
        return Caller(node="status", method="munge", uid=int(m.group(1)))


def _job(job_id: int, user: str, uid: int | None) -> Job:
    return Job(
        job_id=job_id,
        name=f"job{job_id}",
        user=user,
        uid=uid,
        state=JobState.RUNNING,
        nodes=("gpu1",),
        gpus=GpuRequest(gpus=1),
    )


@pytest.fixture
def service(tmp_path: Path) -> Iterator[IngestService]:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    nobody = 65534
    snap = ClusterSnapshot(
        taken_at=datetime.now(UTC),
        jobs=(_job(1, "root", 0), _job(2, "nobody", nobody), _job(3, "nobody", None)),
        nodes=(Node("gpu1", "mixed", address="127.0.0.1"),),
    )
    directory = NodeDirectory(lambda: snap)
    auth = HeaderUidAuth(site_secret=SECRET, node_addresses=directory.addresses)
    yield IngestService(UsageStore(store.engine), auth, directory)


def _ids(reply: bytes) -> list[str]:
    return [j["job_id"] for j in json.loads(reply)["jobs"]]


def test_a_user_sees_only_their_own_jobs(service: IngestService) -> None:
    status, reply = service.get_jobs("127.0.0.1", "Test uid=65534", None)
    assert status == 200
    assert _ids(reply) == ["2", "3"]
    assert json.loads(reply)["admin"] is False


def test_a_user_may_not_ask_for_another_users_jobs(service: IngestService) -> None:
    status, reply = service.get_jobs("127.0.0.1", "Test uid=65534", "root")
    assert status == 403
    assert "own jobs" in json.loads(reply)["error"]


def test_an_admin_sees_every_job_or_one_users(service: IngestService) -> None:
    assert _ids(service.get_jobs("127.0.0.1", "Test uid=0", None)[1]) == ["1", "2", "3"]
    assert _ids(service.get_jobs("127.0.0.1", "Test uid=0", "nobody")[1]) == ["2", "3"]


def test_an_unknown_uid_sees_nothing(service: IngestService) -> None:
    status, reply = service.get_jobs("127.0.0.1", "Test uid=4000000", None)
    assert status == 200 and _ids(reply) == []


@pytest.mark.parametrize(
    "header",
    [None, "", "Basic cm9vdDpyb290", "Munge MUNGE:bogus", "Sgpu-HMAC node=gpu1,ts=1,sig=00"],
)
def test_status_needs_a_user_credential(service: IngestService, header: str | None) -> None:
    status, reply = service.get_jobs("127.0.0.1", header, None)
    assert status == 401
    assert "\n" not in json.loads(reply)["error"]


def test_a_node_token_is_not_a_user_credential(service: IngestService) -> None:
    header = hmac_header(node_token(SECRET, "gpu1"), "gpu1", b"")
    status, reply = service.get_jobs("127.0.0.1", header, None)
    assert status == 401
    assert "MUNGE" in json.loads(reply)["error"]


def test_a_node_cannot_read_another_nodes_job_list(service: IngestService) -> None:
    header = hmac_header(node_token(SECRET, "gpu2"), "gpu2", b"")
    assert service.get_node_jobs("127.0.0.1", header, "gpu1")[0] == 403
    own = hmac_header(node_token(SECRET, "gpu1"), "gpu1", b"")
    assert service.get_node_jobs("127.0.0.1", own, "gpu1")[0] == 200


def test_a_users_munge_uid_may_not_report_samples() -> None:
    auth = Authenticator(site_secret=SECRET)
    with pytest.raises(AuthError):
        auth.authenticate(None, b"{}")
    # authenticate() checks agent_uids after unmunge; the rule itself:
    assert 65534 not in auth.agent_uids and 0 in auth.agent_uids


# --------------------------------------------------------------------------- network


def test_the_api_listens_on_localhost_unless_configured() -> None:
    assert DaemonSettings().listen == "127.0.0.1:8787"
    assert parse_settings("").daemon.listen.startswith("127.0.0.1:")
    assert parse_listen(":8787") == ("127.0.0.1", 8787)
    assert parse_listen("0.0.0.0:8787") == ("0.0.0.0", 8787)  # only when asked for


# --------------------------------------------------------------------------- file modes


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)  # the worst case: a umask that lets everyone read new files
    try:
        yield
    finally:
        os.umask(old)


def test_database_and_its_wal_files_are_0600_even_with_umask_0(
    tmp_path: Path, open_umask: None
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'db' / 'state.db'}")
    AuditStore(store.engine).record_admin("test", "x", at=datetime.now(UTC), caller_uid=0)
    with store.engine.connect():
        files = sorted((tmp_path / "db").iterdir())
        assert {p.name for p in files} >= {"state.db", "state.db-wal", "state.db-shm"}
        for path in files:
            assert _mode(path) == 0o600, f"{path.name} is {oct(_mode(path))}"


@pytest.mark.slow  # runs sgpu as separate processes
def test_site_secret_and_node_token_files_are_0600(tmp_path: Path, open_umask: None) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[daemon]\nsecret_file = "{tmp_path / "site.secret"}"\n')
    env = {**os.environ, "SGPU_CONFIG": str(config), "SGPU_DB": f"sqlite:///{tmp_path / 's.db'}"}
    out = tmp_path / "node.token"
    proc = subprocess.run(
        [sys.executable, "-m", "slurmgpu", "node-token", "gpu1", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert _mode(tmp_path / "site.secret") == 0o600
    assert _mode(out) == 0o600
    assert _mode(tmp_path / "s.db") == 0o600


def test_spool_files_are_0600_in_a_0700_directory(tmp_path: Path, open_umask: None) -> None:
    directory = tmp_path / "spool"
    with BatchSpool(directory, max_bytes=200) as spool:
        for _ in range(5):  # 5 x 60 B overflow 200 B: the dropped-sample counter is written
            spool.append(b"x" * 44, samples=2)
    assert _mode(directory) == 0o700
    files = list(directory.iterdir())
    assert any(p.name == "dropped_samples" for p in files)
    for path in files:
        assert _mode(path) == 0o600, f"{path.name} is {oct(_mode(path))}"


# --------------------------------------------------------------------------- admin audit


@pytest.mark.slow  # runs sgpu as separate processes
def test_admin_actions_are_audited_with_the_callers_uid(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[daemon]\nsecret_file = "{tmp_path / "site.secret"}"\n')
    db = f"sqlite:///{tmp_path / 's.db'}"
    env = {**os.environ, "SGPU_CONFIG": str(config), "SGPU_DB": db, "SUDO_UID": "4321"}
    for argv in (["db", "upgrade"], ["node-token", "gpu7"]):
        proc = subprocess.run(
            [sys.executable, "-m", "slurmgpu", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
    rows = AuditStore(open_store(db, migrate=False).engine).list(policy="admin")
    assert [r.kind for r in reversed(rows)] == ["db_upgrade", "node_token"]
    for r in rows:
        assert r.caller_uid == os.getuid()
        assert r.outcome == "done"
        assert "via sudo from uid 4321" in r.reason
    assert "gpu7" in rows[0].reason


@pytest.mark.slow  # runs sgpu as separate processes
def test_no_token_is_issued_when_the_audit_cannot_be_written(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[daemon]\nsecret_file = "{tmp_path / "site.secret"}"\n')
    (tmp_path / "ro").mkdir()
    env = {
        **os.environ,
        "SGPU_CONFIG": str(config),
        "SGPU_DB": f"sqlite:///file:{tmp_path / 'ro' / 'missing.db'}?mode=ro&uri=true",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "slurmgpu", "node-token", "gpu1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 4, proc.stderr
    assert not re.search(r"^[0-9a-f]{64}$", proc.stdout, re.M), "the token must not be shown"
    assert "Traceback" not in proc.stderr


def test_every_policy_decision_records_the_daemons_uid(store: JobStore) -> None:
    from slurmgpu.policy.base import Action, Decision, Mode

    audit = AuditStore(store.engine)
    action = Action(policy="idle_gpu", kind="warn", job_id=5, user="alice", reason="idle")
    audit.record([Decision(action, Mode.ADVISE, execute=False, notify=True)], datetime.now(UTC))
    (row,) = audit.list()
    assert row.caller_uid == os.geteuid()


# --------------------------------------------------------------------------- code audit


# Alembic revisions are DDL (triggers, functions), which takes no bound parameters; they
# build it from their own module constants only, run once at `sgpu db upgrade`, and read
# no outside input. Everything else in the package is checked.
_MIGRATIONS = PACKAGE / "store" / "migrations" / "versions"


def _python_files() -> list[Path]:
    return [p for p in python_files("slurmgpu") if _MIGRATIONS not in p.parents]


_SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|PRAGMA|CREATE|DROP|ALTER)\b", re.I)
_SQL_SHAPE = re.compile(
    r"\b(SELECT\b.+\bFROM|INSERT\s+INTO|UPDATE\b.+\bSET|DELETE\s+FROM|PRAGMA\s|"
    r"CREATE\s+TABLE|DROP\s+TABLE|ALTER\s+TABLE)",
    re.I | re.S,
)
_EXECUTORS = {"execute", "executemany", "executescript", "exec_driver_sql", "text"}


def _literal_text(node: ast.AST) -> str:
    """The constant parts of a string expression (f-string pieces, concatenations)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_literal_text(v) for v in node.values)
    if isinstance(node, ast.BinOp):
        return _literal_text(node.left) + _literal_text(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return _literal_text(node.func.value)
    return ""


# Names that may be interpolated into SQL text: sample_ingest.py's bulk insert (the hot path, one
# executemany per batch) builds its column list and "?"/"%s" marks from these constants;
# every value still goes in as a bound parameter.
SAFE_SQL_NAMES = frozenset({"_GPU_COLUMNS", "_HOST_COLUMNS", "mark", "len"})


def _is_built(node: ast.AST) -> bool:
    """True for a string assembled at run time: f-string with fields, %, +, .format()."""
    if isinstance(node, ast.JoinedStr):
        fields = [v for v in node.values if isinstance(v, ast.FormattedValue)]
        names = {n.id for f in fields for n in ast.walk(f) if isinstance(n, ast.Name)}
        return bool(fields) and not names <= SAFE_SQL_NAMES
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
    )


def sql_built_from_strings(source: str) -> list[int]:
    """Lines where SQL text is assembled from values instead of bound parameters."""
    return sql_built_in(ast.parse(source))


def sql_built_in(tree: ast.Module) -> list[int]:
    """:func:`sql_built_from_strings` of a parsed module."""
    bad: list[int] = []
    for node in ast.walk(tree):
        if _is_built(node) and _SQL_SHAPE.search(_literal_text(node)):
            bad.append(getattr(node, "lineno", 0))
        if isinstance(node, ast.Call):
            name = (
                node.func.attr
                if isinstance(node.func, ast.Attribute)
                else (node.func.id if isinstance(node.func, ast.Name) else "")
            )
            if name in _EXECUTORS and node.args and _is_built(node.args[0]):
                text = _literal_text(node.args[0])
                if _SQL.search(text) or name in {"exec_driver_sql", "executescript"}:
                    bad.append(node.lineno)
    return sorted(set(bad))


def test_the_sql_check_catches_what_it_is_meant_to_catch() -> None:
    bad = """
conn.execute(text(f"SELECT * FROM jobs WHERE user = '{user}'"))
cur.execute("DELETE FROM jobs WHERE id = %s" % job_id)
cur.execute("UPDATE jobs SET state = '{}'".format(state))
q = "SELECT name FROM jobs WHERE id = " + str(i)
"""
    good = """
conn.execute(select(jobs).where(jobs.c.user == user))
cur.execute("PRAGMA journal_mode=WAL")
log.info(f"updated {n} jobs from the listing")
raise StoreError(f"could not select a row: {exc}")
"""
    assert sql_built_from_strings(bad) == [2, 3, 4, 5]
    assert sql_built_from_strings(good) == []


def test_sql_goes_only_through_bound_parameters() -> None:
    found = {
        str(p.relative_to(REPO)): lines
        for p in _python_files()
        if (lines := sql_built_in(parsed(p)))
    }
    assert found == {}, f"SQL assembled from strings (use bound parameters): {found}"


def _calls(tree: ast.AST) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def test_no_command_runs_through_a_shell_and_nothing_changes_its_uid() -> None:
    banned_attrs = {"system", "popen", "setuid", "seteuid", "setreuid", "setresuid", "execl"}
    found: list[str] = []
    for path in _python_files():
        for call in _calls(parsed(path)):
            where = f"{path.relative_to(REPO)}:{call.lineno}"
            for kw in call.keywords:
                if kw.arg == "shell" and not (
                    isinstance(kw.value, ast.Constant) and kw.value.value is False
                ):
                    found.append(f"{where} shell=")
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr in banned_attrs:
                owner = func.value.id if isinstance(func.value, ast.Name) else ""
                if owner == "os":
                    found.append(f"{where} os.{func.attr}")
            if isinstance(func, ast.Attribute) and func.attr in {"run", "Popen", "check_output"}:
                first = call.args[0] if call.args else None
                if isinstance(first, ast.Constant | ast.JoinedStr):
                    found.append(f"{where} command given as one string")
    for path in _python_files():
        text = source(path)
        if re.search(r"[\"']sudo[\"']|[\"']su[\"']|runuser", text):
            found.append(f"{path.relative_to(REPO)} names sudo/su/runuser")
    assert found == []


# --------------------------------------------------------------------------- sgpu submit

FAKE_SBATCH = """#!{python}
import json, os, sys
with open({record!r}, "w") as f:
    json.dump({{"argv": sys.argv[1:], "uid": os.getuid(), "euid": os.geteuid()}}, f)
print("4242")
"""

NASTY = [
    "x$(touch {d}/dollar)",
    "y`touch {d}/backtick`",
    "z; touch {d}/semicolon",
    "w' && touch {d}/quote '",
    'v" | touch {d}/pipe "',
    "u\n touch {d}/newline",
    "--parsable --wrap='touch {d}/option'",
]


@pytest.mark.slow  # runs sgpu as separate processes
def test_submit_passes_job_names_and_comments_verbatim_without_a_shell(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "sbatch.json"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(FAKE_SBATCH.format(python=sys.executable, record=str(record)))
    sbatch.chmod(0o755)
    marks = tmp_path / "marks"
    marks.mkdir()
    db = f"sqlite:///{tmp_path / 's.db'}"
    config = tmp_path / "c.toml"
    config.write_text('[slurm]\nbackend = "cli"\n')
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SGPU_DB": db,
        "SGPU_CONFIG": str(config),
    }
    subprocess.run(
        [sys.executable, "-m", "slurmgpu", "db", "upgrade"],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    for template in NASTY:
        text = template.format(d=marks)
        argv = ["submit", "--rightsize", "-J", text, f"--comment={text}", "--wrap", "true"]
        proc = subprocess.run(
            [sys.executable, "-m", "slurmgpu", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(record.read_text())
        assert seen["argv"] == [
            "--parsable",
            "-J",
            text,
            f"--comment={text} sgpu:rightsize",
            "--wrap",
            "true",
        ]
        assert seen["uid"] == seen["euid"] == os.getuid(), "sbatch runs as the caller"
    assert list(marks.iterdir()) == [], "a metacharacter was interpreted by a shell"
    rows = open_store(db, migrate=False).submissions(4242)
    assert len(rows) == len(NASTY)
    assert [r["argv"][1] for r in rows] == [t.format(d=marks) for t in NASTY]


def test_admin_uids_are_configurable_and_checked() -> None:
    from slurmgpu.config import ConfigError

    assert parse_settings("").daemon.admin_uids == (0,)
    assert parse_settings("[daemon]\nadmin_uids = [0, 1001]\n").daemon.admin_uids == (0, 1001)
    for bad in ('"root"', "[-1]", "[true]", '["0"]'):
        with pytest.raises(ConfigError) as info:
            parse_settings(f"[daemon]\nadmin_uids = {bad}\n")
        assert info.value.line == 2 and "list of uids" in str(info.value)


def test_a_configured_admin_sees_every_job(service: IngestService) -> None:
    service.auth.admin_uids = frozenset({0, 65534})
    status, reply = service.get_jobs("127.0.0.1", "Test uid=65534", None)
    assert status == 200 and _ids(reply) == ["1", "2", "3"]
