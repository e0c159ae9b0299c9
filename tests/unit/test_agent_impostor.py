"""Issue 36, finding 2: an agent hands its data only to the daemon, and deletes spooled
batches only on the daemon's signed reply to that very request.

The real daemon API (``ApiServer`` with a SQLite store) serves a real agent loop
(simulated GPUs, real HTTP on 127.0.0.1). It is stopped, as the admin guide's upgrade does,
and an impostor binds its port: one that answers ``{"accepted": N}`` to everything, and one
that replays, byte for byte, replies it captured from the genuine daemon. Neither gets a
spooled batch deleted; when the daemon comes back every sequence number reaches the store.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from slurmgpu.agent.loop import AgentLoop
from slurmgpu.agent.sender import DaemonClient, HmacAuth, MungeAuth, SendOutcome
from slurmgpu.daemon.api import ApiServer
from slurmgpu.daemon.auth import Authenticator
from slurmgpu.daemon.ingest import IngestService
from slurmgpu.daemon.node_directory import NodeDirectory
from slurmgpu.model import ClusterSnapshot, Node
from slurmgpu.replyauth import REPLY_HEADER, ReplyAuthError, reply_message
from slurmgpu.store import JobStore, open_store
from slurmgpu.store.usage import UsageStore
from slurmgpu.wire import (
    SampleBatch,
    encode,
    hmac_header,
    munge_available,
    munge_header,
    node_token,
)
from tests.unit.agent_rig import NODE, SECRET, gres_conf, make_loop, sim_dir

__all__ = ["gres_conf", "sim_dir"]  # fixtures, used by name


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class Impostor:
    """Whoever binds the daemon's port while it is stopped: answers every request with a
    canned reply (by method), and records the bodies it was handed."""

    port: int
    replies: dict[str, Reply]
    received: list[tuple[str, bytes]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> Impostor:
        impostor = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                impostor.received.append((method, body))
                reply = impostor.replies[method]
                self.send_response(reply.status)
                for name, value in reply.headers:
                    if name.lower() not in ("server", "date", "connection"):
                        self.send_header(name, value)
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(reply.body)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def posted(self) -> int:
        return sum(method == "POST" for method, _ in self.received)


@dataclass
class Daemon:
    usage: UsageStore
    service: IngestService
    port: int = 0
    server: ApiServer | None = None

    def start(self) -> Daemon:
        self.server = ApiServer(self.service, "127.0.0.1", self.port)
        self.port = self.server.address[1]
        self.server.start()
        return self

    def stop(self) -> None:
        assert self.server is not None
        self.server.stop()
        self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def seqs(self) -> set[int]:
        """The agent cycles (sequence numbers) whose samples are in the store."""
        with self.usage.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT sample_uid FROM samples").fetchall()
        return {int(str(uid).split(":")[2]) for (uid,) in rows}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    snap = ClusterSnapshot(
        taken_at=datetime.now(UTC), jobs=(), nodes=(Node(NODE, "mixed", address="127.0.0.1"),)
    )
    directory = NodeDirectory(lambda: snap)
    auth = Authenticator(site_secret=SECRET, allow_munge=False, node_addresses=directory.addresses)
    usage = UsageStore(store.engine)
    d = Daemon(usage, IngestService(usage, auth, directory)).start()
    yield d
    if d.server is not None:
        d.stop()


def _capture(daemon: Daemon, method: str, path: str, body: bytes) -> Reply:
    """A genuine reply of the daemon to a genuine request of this node (what an impostor
    on the network, or the host, could have recorded earlier)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=20)
    try:
        header = hmac_header(node_token(SECRET, NODE), NODE, body)
        conn.request(method, path, body=body or None, headers={"Authorization": header})
        resp = conn.getresponse()
        return Reply(resp.status, resp.getheaders(), resp.read())
    finally:
        conn.close()


def _accepted_reply() -> Reply:
    body = b'{"accepted": 12, "duplicates": 0}'
    return Reply(
        200, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))], body
    )


def test_an_impostor_on_the_daemons_port_gets_nothing_deleted_and_every_batch_arrives_later(
    daemon: Daemon,
    gres_conf: Path,
    sim_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="slurmgpu")
    loop = make_loop(daemon, gres_conf, sim_dir, tmp_path / "spool")  # type: ignore[arg-type]
    assert loop.run_once().sent
    replayed = {
        "GET": _capture(daemon, "GET", f"/v1/nodes/{NODE}/jobs", b""),
        "POST": _capture(daemon, "POST", "/v1/samples", _one_batch(loop)),
    }
    assert replayed["POST"].status == 200 and any(
        name == REPLY_HEADER for name, _ in replayed["POST"].headers
    )
    daemon.stop()  # the upgrade: the port is free

    impostors = [
        Impostor(daemon.port, {"GET": _accepted_reply(), "POST": _accepted_reply()}),
        Impostor(daemon.port, replayed),
    ]
    for impostor in impostors:
        impostor.start()
        try:
            reports = [loop.run_once() for _ in range(3)]
        finally:
            impostor.stop()
        assert all(r.spooled and not r.sent and r.drained == 0 for r in reports)
        # The job list is asked for first, and its reply is not the daemon's: no samples
        # leave the node in that cycle.
        assert impostor.posted() == 0
    assert len(loop.spool) == 6  # nothing deleted

    errors = [
        r.getMessage()
        for r in caplog.records
        if "without proving it is the daemon" in r.getMessage()
    ]
    assert len(errors) == 2, errors  # one per kind of bad reply, not one per batch

    daemon.start()  # back, on the same port
    back = loop.run_once()
    assert back.sent and back.drained == 6 and len(loop.spool) == 0
    assert daemon.seqs() == set(range(1, loop.sampler.seq + 1))


def _one_batch(loop: AgentLoop) -> bytes:
    """A batch of this node the daemon will take (sampled now, not part of the loop's run)."""
    from slurmgpu.wire import SampleBatch

    # Stamped now: the daemon refuses samples stamped ahead of its clock (issue 36 item 5).
    gpu, host = loop.sampler.sample(loop.jobs, time.time())
    return encode(SampleBatch(node=NODE, gpu=gpu, host=host))


def test_spooled_batches_are_not_dropped_on_an_impostors_refusal_either(
    daemon: Daemon, tmp_path: Path
) -> None:
    # A 400 means "drop this batch for good": only the daemon's signed 400 may say so.
    daemon.stop()
    bad = b'{"error": "invalid batch"}'
    impostor = Impostor(
        daemon.port,
        {
            "POST": Reply(
                400, [("Content-Type", "application/json"), ("Content-Length", str(len(bad)))], bad
            )
        },
    ).start()
    try:
        client = DaemonClient(daemon.url, NODE, HmacAuth(node_token(SECRET, NODE)))
        result = client.post_samples(b'{"node": "x"}')
    finally:
        impostor.stop()
    assert result.outcome is SendOutcome.RETRY and result.unauthenticated
    assert "without the daemon's Sgpu-Reply signature" in result.error


def test_a_genuine_reply_replayed_to_a_later_request_for_the_same_batch_does_not_count(
    daemon: Daemon, gres_conf: Path, sim_dir: Path, tmp_path: Path
) -> None:
    # The same bytes sent again (a spooled batch resent) make a new request: the reply
    # captured for the first send does not fit it.
    loop = make_loop(daemon, gres_conf, sim_dir, tmp_path / "spool")  # type: ignore[arg-type]
    body = _one_batch(loop)
    genuine = _capture(daemon, "POST", "/v1/samples", body)
    daemon.stop()
    impostor = Impostor(daemon.port, {"POST": genuine}).start()
    try:
        client = DaemonClient(daemon.url, NODE, HmacAuth(node_token(SECRET, NODE)))
        result = client.post_samples(body)
    finally:
        impostor.stop()
    assert impostor.posted() == 1
    assert result.outcome is SendOutcome.RETRY and result.unauthenticated
    assert "signature does not fit this request" in result.error


# -- MUNGE: the reply's credential must be the daemon uid's, for this request -----------


def _munge_as(uid: int, payload: bytes) -> str:
    """A credential made by ``uid`` (what an unprivileged user on a cluster host can make)."""
    import subprocess

    argv = (
        ["munge"]
        if uid == os.geteuid()
        else ["setpriv", f"--reuid={uid}", "--clear-groups", "munge"]
    )
    out = subprocess.run(argv, input=payload, capture_output=True, check=True, timeout=20)
    return "Munge " + out.stdout.decode().strip()


@pytest.mark.skipif(
    not munge_available() or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs munged, root and setpriv (a credential of another uid)",
)
def test_a_munge_reply_counts_only_from_the_daemons_uid_and_only_once() -> None:
    auth = MungeAuth(frozenset({0}))
    request = munge_header(NODE, b"{}")
    reply = b'{"accepted": 1, "duplicates": 0}'
    message = reply_message(NODE, request, b"{}", 200, reply)
    genuine = _munge_as(0, message)
    auth.check_reply(NODE, request, b"{}", 200, reply, genuine)  # the daemon's: fine
    with pytest.raises(ReplyAuthError, match="credential rejected"):  # replayed
        auth.check_reply(NODE, request, b"{}", 200, reply, genuine)
    with pytest.raises(ReplyAuthError, match="signed by uid 65534, not the daemon's"):
        auth.check_reply(NODE, request, b"{}", 200, reply, _munge_as(65534, message))
    other = munge_header(NODE, b"{}")  # the same batch, sent again: a new request
    with pytest.raises(ReplyAuthError, match="does not fit this request"):
        auth.check_reply(NODE, other, b"{}", 200, reply, _munge_as(0, message))
    with pytest.raises(ReplyAuthError, match="without the daemon's"):
        auth.check_reply(NODE, request, b"{}", 200, reply, None)


@pytest.mark.skipif(not munge_available(), reason="munged is not running here")
def test_the_daemon_signs_munge_replies_that_the_agent_takes_only_from_its_uid(
    store: JobStore,
) -> None:
    snap = ClusterSnapshot(
        taken_at=datetime.now(UTC), jobs=(), nodes=(Node(NODE, "mixed", address="127.0.0.1"),)
    )
    directory = NodeDirectory(lambda: snap)
    auth = Authenticator(
        allow_munge=True,
        agent_uids=frozenset({os.geteuid()}),
        node_addresses=directory.addresses,
    )
    usage = UsageStore(store.engine)
    daemon = Daemon(usage, IngestService(usage, auth, directory)).start()
    try:
        body = encode(SampleBatch(node=NODE))
        mine = DaemonClient(daemon.url, NODE, MungeAuth(frozenset({os.geteuid()})))
        assert mine.post_samples(body).outcome is SendOutcome.SENT
        assert mine.fetch_jobs().node == NODE
        elsewhere = DaemonClient(daemon.url, NODE, MungeAuth(frozenset({os.geteuid() + 4242})))
        refused = elsewhere.post_samples(body)
        assert refused.outcome is SendOutcome.RETRY and refused.unauthenticated
        assert f"signed by uid {os.geteuid()}, not the daemon's" in refused.error
    finally:
        daemon.stop()
