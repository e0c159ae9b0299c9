"""``sgpu node-token``: make the token a node agent signs with when munged is not running.

The token is ``HMAC(site secret, "node:" + NODE)``: it lets an agent report for that node
and no other. Run it on the daemon host (it reads the site secret) and install the file
on the node as /etc/slurmgpu/node.token, mode 600. Issuing a token is an admin action: it
is written to the audit (``sgpu actions --policy admin``) with the caller's uid before
the token is shown; if the audit cannot be written, no token is issued.
"""

from __future__ import annotations

import getpass
import os
import re
from datetime import UTC, datetime
from pathlib import Path

import click

from slurmgpu.cli.context import EXIT_STORE, AppContext, fail, pass_app
from slurmgpu.store import StoreError
from slurmgpu.store.audit import AuditStore
from slurmgpu.wire import NODE_NAME, AuthError, load_or_create_site_secret, node_token, write_secret


@click.command("node-token")
@click.argument("node")
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the token here (mode 600) instead of printing it.",
)
@pass_app
def node_token_command(app: AppContext, node: str, out: Path | None) -> None:
    """Print or write the agent token of NODE (needs read access to the site secret)."""
    if not re.match(NODE_NAME, node):
        fail(f"{node!r} is not a node name", 2)
    try:
        secret = load_or_create_site_secret(Path(app.settings.daemon.secret_file))
    except (AuthError, OSError) as exc:
        fail(f"site secret {app.settings.daemon.secret_file}: {exc}")
    token = node_token(secret, node).hex()
    audit_admin_action(app, "node_token", f"issued the agent token of node {node}")
    if out is None:
        click.echo(token)
        return
    try:
        write_secret(out, (token + "\n").encode())
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror}")
    click.echo(f"wrote the token of node {node} to {out} (mode 600)")


def audit_admin_action(app: AppContext, kind: str, reason: str) -> None:
    """Record an admin action with the caller's uid, or stop: nothing is done unaudited."""
    sudo = os.environ.get("SUDO_UID")
    if sudo and sudo.isdigit() and int(sudo) != os.getuid():
        reason += f" (via sudo from uid {sudo})"
    store = app.store(migrate=True)
    try:
        AuditStore(store.engine, store.cluster).record_admin(
            kind, reason, at=datetime.now(UTC), caller_uid=os.getuid(), user=getpass.getuser()
        )
    except StoreError as exc:
        fail(f"{exc}; nothing done", EXIT_STORE)
