"""The examples at the end of each command's ``--help``.

``sgpu`` itself has them in main.py (which must not import this at start), ``sgpu
submit`` in its own help layout.

Kept in one table, keyed by the command's path under ``sgpu``, so that a new command
without one is caught by a test and the command modules stay about their commands.
"""

from __future__ import annotations

import click

EXAMPLES: dict[str, tuple[str, ...]] = {
    "actions": (
        "sgpu actions --taken --limit 20",
        "sgpu actions --job 1234 --json",
        "sgpu actions --watch --taken",
    ),
    "advice": ("sgpu advice", "sgpu advice 1234 --json"),
    "agent": (
        "sgpu agent --daemon http://head:8787",
        "sgpu agent --probe sim --once --daemon http://127.0.0.1:8787",
    ),
    "cluster": ("sgpu cluster up --nodes 4", 'eval "$(sgpu cluster env)"', "sgpu cluster down"),
    "cluster down": ("sgpu cluster down", "sgpu cluster down --keep-jobs"),
    "cluster env": ('eval "$(sgpu cluster env)"',),
    "cluster status": ("sgpu cluster status", "sgpu cluster status --json"),
    "cluster up": (
        "sgpu cluster up",
        "sgpu cluster up --nodes 2 --port 7300",
        "sgpu cluster up --slurm-root /srv/slurmgpu-chroot-sid --accounting",
    ),
    "daemon": (
        "sgpu daemon",
        "sgpu daemon --once --no-policies",
        "sgpu daemon --interval 10s --log-format json",
    ),
    "db": ("sgpu db upgrade", "sgpu --db sqlite:///tmp/sgpu.db db current"),
    "db current": ("sgpu db current",),
    "db upgrade": ("sgpu db upgrade", "sgpu --db postgresql+psycopg://sgpu@db/sgpu db upgrade"),
    "db check": ("sgpu db check", "sgpu db check && systemctl start slurmgpu-daemon"),
    "eff": ("sgpu eff 1234", "sgpu eff 120_3 --json"),
    "launch": (
        "exec sgpu launch -- torchrun --standalone --nproc-per-node=$SGPU_GPUS train.py",
        "exec sgpu launch -- srun python train.py",
    ),
    "fakeload": (
        "sgpu fakeload --util 30 --mem 4G --duration 10m",
        "sgpu fakeload --pattern idle-after:60s --duration 1h",
    ),
    "jobs": (
        "sgpu jobs --active",
        "sgpu jobs -u alice -t RUNNING --json",
        "sgpu jobs --watch --active",
    ),
    "monitoring": (
        "sgpu monitoring rules -o /etc/prometheus/rules/slurmgpu.yml",
        "sgpu monitoring dashboard -o /var/lib/grafana/dashboards/slurmgpu.json",
    ),
    "monitoring dashboard": (
        "sgpu monitoring dashboard -o /var/lib/grafana/dashboards/slurmgpu.json",
    ),
    "monitoring rules": (
        "sgpu monitoring rules -o /etc/prometheus/rules/slurmgpu.yml",
        "sgpu monitoring rules | promtool check rules /dev/stdin",
    ),
    "node-token": ("sgpu node-token gpu01", "sgpu node-token gpu01 -o /etc/slurmgpu/node.token"),
    "policy": ("sgpu policy show", "sgpu policy check /etc/slurmgpu/config.toml"),
    "policy check": ("sgpu policy check /etc/slurmgpu/config.toml",),
    "policy show": ("sgpu policy show", "sgpu policy show --json"),
    "report": (
        "sgpu report --since 7d",
        "sgpu report --since 30d --by account --format html -o report.html",
    ),
    "resizes": ("sgpu resizes", "sgpu resizes --job 1234 --json"),
    "simulate": (
        "sgpu simulate trace.csv --format csv --policies slurm,rightsize",
        "sgpu simulate workload.csv --cluster 8x4 --html out.html",
    ),
    "whatif": (
        "sgpu whatif --since 30d",
        "sgpu whatif --since 2026-03-01 --policies rightsize,colocate --cluster 16x4 --json",
    ),
}


def epilog(path: str) -> str | None:
    """The help epilog of the command at ``path`` (``"cluster up"``), or None."""
    lines = EXAMPLES.get(path)
    if not lines:
        return None
    # "\b" keeps click from re-wrapping the paragraph into one line.
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def attach(command: click.Command, path: str) -> None:
    """Give ``command`` (and a group's subcommands) their examples, once."""
    if command.epilog is None:
        command.epilog = epilog(path)
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            attach(sub, f"{path} {name}".strip())
