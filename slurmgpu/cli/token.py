"""``sgpu node-token``: make the token a node agent signs with when munged is not running.

The token is ``HMAC(site secret, "node:" + NODE)``: it lets an agent report for that node
and no other. Run it on the daemon host (it reads the site secret) and install the file
on the node as /etc/slurmgpu/node.token, mode 600.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from slurmgpu.cli.context import AppContext, fail, pass_app
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
    if out is None:
        click.echo(token)
        return
    try:
        write_secret(out, (token + "\n").encode())
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror}")
    click.echo(f"wrote the token of node {node} to {out} (mode 600)")
