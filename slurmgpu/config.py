"""TOML configuration → validated, typed settings, with errors that name file, line and key.

Example (every key is optional; these are the defaults)::

    [daemon]
    poll_interval = "30s"
    max_backoff = "5m"
    database = "sqlite:////var/lib/slurmgpu/state.db"
    listen = "127.0.0.1:8787"
    mode = "advise"            # observe | advise | enforce
    vanish_after_cycles = 2
    api = true                 # serve the agent ingest API on `listen`
    secret_file = "/etc/slurmgpu/site.secret"   # for agents without MUNGE (0600, created)
    admin_comment = false      # copy each job's usage summary into its AdminComment
    lease_ttl = "60s"          # single writer: another daemon takes over this long after
                               # the last heartbeat (docs/reliability.md)
    admin_uids = [0]           # may see every user's jobs in GET /v1/jobs
    sample_retention = "6h"    # raw samples older than this are rolled up per hour, deleted
    rollup_retention = "90d"   # hourly rollups older than this are deleted
    metrics_max_users = 20     # users with their own sgpu_user_* series; the rest: (other)

    [slurm]
    backend = "auto"           # auto | cli | pyslurm
    command_timeout = "30s"
    cluster = ""               # label stored with every job; default: ClusterName

Precedence: command-line options > environment (``SGPU_DB``, ``SGPU_CONFIG``) > file >
defaults.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

# ConfigError and parse_duration stay importable from here: they are this module's API
# (cli/submit.py and the tests read them from config).
from slurmgpu.listen_address import parse_listen
from slurmgpu.settings_table import ConfigError, TableReader
from slurmgpu.units import parse_duration

if TYPE_CHECKING:
    from slurmgpu.cycle.resize import ResizeSettings
    from slurmgpu.notify.settings import NotifySettings
    from slurmgpu.policy.settings import (
        AttainedServiceSettings,
        ColocateSettings,
        EngineSettings,
        IdleGpuSettings,
        MalleableSettings,
        RightsizeSettings,
    )
    from slurmgpu.policy.sizing import SizingRules

__all__ = [
    "BACKENDS",
    "DEFAULT_CONFIG_PATH",
    "MODES",
    "ConfigError",
    "DaemonSettings",
    "PolicySettings",
    "Settings",
    "SlurmSettings",
    "default_database_url",
    "default_secret_file",
    "load_settings",
    "parse_duration",
    "parse_settings",
]

DEFAULT_CONFIG_PATH = Path("/etc/slurmgpu/config.toml")
MODES = ("observe", "advise", "enforce")
BACKENDS = ("auto", "cli", "pyslurm")

MAX_HISTORY_DAYS = 3650
# A file with more bad keys than this is reported up to here (each on its own line).
_MAX_REPORTED = 50


def _user_state_dir() -> Path:
    """Where a non-root user's slurmgpu state lives (XDG_STATE_HOME)."""
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "slurmgpu"


def default_database_url() -> str:
    """Return the default SQLite URL: system-wide for root, per-user otherwise."""
    if os.geteuid() == 0:
        return "sqlite:////var/lib/slurmgpu/state.db"
    return f"sqlite:///{_user_state_dir() / 'state.db'}"


def default_secret_file() -> str:
    """Return where the daemon keeps its site secret for agent tokens."""
    if os.geteuid() == 0:
        return "/etc/slurmgpu/site.secret"
    return str(_user_state_dir() / "site.secret")


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    poll_interval: timedelta = timedelta(seconds=30)
    max_backoff: timedelta = timedelta(minutes=5)
    database: str = field(default_factory=default_database_url)
    listen: str = "127.0.0.1:8787"
    mode: str = "advise"
    vanish_after_cycles: int = 2
    api: bool = True
    secret_file: str = field(default_factory=default_secret_file)
    admin_comment: bool = False
    lease_ttl: timedelta = timedelta(seconds=60)
    admin_uids: tuple[int, ...] = (0,)
    # Sized for a 1,000-GPU site to stay under 2 GB (docs/configuration.md#retention).
    sample_retention: timedelta = timedelta(hours=6)
    rollup_retention: timedelta = timedelta(days=90)
    # Each user is a Prometheus series of sgpu_user_gpus_*: bounded (docs/metrics.md).
    metrics_max_users: int = 20


@dataclass(frozen=True, slots=True)
class SlurmSettings:
    backend: str = "auto"
    command_timeout: timedelta = timedelta(seconds=30)
    cluster: str = ""


def _engine() -> EngineSettings:
    from slurmgpu.policy.settings import EngineSettings

    return EngineSettings()


def _rightsize() -> RightsizeSettings:
    from slurmgpu.policy.settings import RightsizeSettings

    return RightsizeSettings()


def _sizing() -> SizingRules:
    from slurmgpu.policy.sizing import SizingRules

    return SizingRules()


def _idle_gpu() -> IdleGpuSettings:
    from slurmgpu.policy.settings import IdleGpuSettings

    return IdleGpuSettings()


def _colocate() -> ColocateSettings:
    from slurmgpu.policy.settings import ColocateSettings

    return ColocateSettings()


def _malleable() -> MalleableSettings:
    from slurmgpu.policy.settings import MalleableSettings

    return MalleableSettings()


def _las() -> AttainedServiceSettings:
    from slurmgpu.policy.settings import AttainedServiceSettings

    return AttainedServiceSettings()


def _resize() -> ResizeSettings:
    from slurmgpu.cycle.resize import ResizeSettings

    return ResizeSettings()


def _notify() -> NotifySettings:
    from slurmgpu.notify.settings import NotifySettings

    return NotifySettings()


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """``[policy]``: the engine's guardrails and each policy's own table.

    A policy table without ``mode`` takes ``daemon.mode`` (advise on a fresh install).
    ``history_days``: how far back priors learn from finished jobs. ``[policy.resize]``
    paces the resizes the malleable policy decides (``cycle.resize.ResizeSettings``).
    ``sizing``: the site's one set of sizing rules (``policy.sizing.SizingRules``), whose
    knobs the file writes in ``[policy.rightsize]`` and ``[policy.colocate]``
    (``policy.settings.SIZING_KEYS``); rightsizing, co-location, the export and ``sgpu
    eff`` all take it.
    """

    engine: EngineSettings = field(default_factory=_engine)
    sizing: SizingRules = field(default_factory=_sizing)
    rightsize: RightsizeSettings = field(default_factory=_rightsize)
    idle_gpu: IdleGpuSettings = field(default_factory=_idle_gpu)
    colocate: ColocateSettings = field(default_factory=_colocate)
    malleable: MalleableSettings = field(default_factory=_malleable)
    las: AttainedServiceSettings = field(default_factory=_las)  # off unless enabled
    resize: ResizeSettings = field(default_factory=_resize)
    history_days: int = 90
    history_refresh: timedelta = timedelta(minutes=10)  # how often priors reload history
    recommendations_file: str = ""  # where job_submit.lua reads advice; "" = don't export


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting slurmgpu reads, validated."""

    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    notify: NotifySettings = field(default_factory=_notify)
    source: Path | None = None

    def with_database(self, url: str) -> Settings:
        return replace(self, daemon=replace(self.daemon, database=url))


def _key_line(text: str, table: str, key: str) -> int | None:
    """Return the 1-based line where ``key`` is set inside ``[table]`` (best effort)."""
    current = ""
    header = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$")
    assign = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for number, line in enumerate(text.splitlines(), start=1):
        h = header.match(line)
        if h:
            current = h.group(1)
            continue
        if current == table and assign.match(line):
            return number
    for number, line in enumerate(text.splitlines(), start=1):
        h = header.match(line)
        if h and h.group(1) == table:
            return number
    return None


class _Reader(TableReader):
    """Reads one table of the TOML document, turning problems into ConfigError with a line."""

    def __init__(self, doc: dict[str, Any], text: str, path: Path | None, table: str) -> None:
        raw = doc.get(table, {})
        if not isinstance(raw, dict):
            raise ConfigError(
                f"[{table}] must be a table", path=path, line=_key_line(text, "", table)
            )
        super().__init__(raw)
        self.text, self.path, self.table = text, path, table

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(
            f"{self.table}.{key} {message}",
            path=self.path,
            line=_key_line(self.text, self.table, key),
            table=self.table,
            key=key,
        )

    def string(self, key: str, default: str, *, choices: tuple[str, ...] | None = None) -> str:
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, not {value!r}")
        if choices is not None and value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}, not {value!r}")
        return value


def parse_settings(text: str, path: Path | None = None) -> Settings:
    """Return validated Settings from TOML text, or raise ConfigError naming line and key.

    Every bad key is reported, one line each (``str()`` of the error): a key found bad
    is dropped and the file read again, until it reads or a problem names no key.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise ConfigError(
            f"not valid TOML: {exc}", path=path, line=int(m.group(1)) if m else None
        ) from None
    found: list[ConfigError] = []
    while True:
        try:
            settings = _parse_document(doc, text, path)
        except ConfigError as exc:
            if any(str(exc) == str(seen) for seen in found):
                break  # dropping the key did not help (a rule between keys): said once
            found.append(exc)
            if len(found) >= _MAX_REPORTED or not _drop_key(doc, exc.table, exc.key):
                break
            continue
        if not found:
            return settings
        break
    first = found[0]
    first.others = tuple(found[1:])
    raise first


def _drop_key(doc: dict[str, Any], table: str | None, key: str | None) -> bool:
    """Remove ``table.key`` from the parsed document; False if it is not there."""
    if table is None or not key:
        return False
    node: Any = doc
    for part in table.split(".") if table else []:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            return False
        node = node[part]
    if key not in node:
        return False
    del node[key]
    return True


def _parse_document(doc: dict[str, Any], text: str, path: Path | None) -> Settings:
    unknown = sorted(set(doc) - {"daemon", "slurm", "policy", "agent", "notify", "report"})
    if unknown:
        raise ConfigError(
            f"[{unknown[0]}] is not a known section",
            path=path,
            line=_key_line(text, unknown[0], ""),
            table="",
            key=unknown[0],
        )
    d = _Reader(doc, text, path, "daemon")
    daemon = DaemonSettings(
        poll_interval=d.duration(
            "poll_interval", timedelta(seconds=30), minimum=timedelta(seconds=1)
        ),
        max_backoff=d.duration("max_backoff", timedelta(minutes=5), minimum=timedelta(seconds=1)),
        database=d.string("database", default_database_url()),
        listen=_listen(d, "listen", "127.0.0.1:8787"),
        mode=d.string("mode", "advise", choices=MODES),
        vanish_after_cycles=d.integer("vanish_after_cycles", 2, minimum=1),
        api=d.boolean("api", True),
        secret_file=d.string("secret_file", default_secret_file()),
        admin_comment=d.boolean("admin_comment", False),
        lease_ttl=d.duration("lease_ttl", timedelta(seconds=60), minimum=timedelta(seconds=1)),
        admin_uids=_uids(d, "admin_uids", (0,)),
        # At least an hour: the idle-GPU and rightsizing policies read the last hour raw.
        sample_retention=d.duration(
            "sample_retention", timedelta(hours=6), minimum=timedelta(hours=1)
        ),
        rollup_retention=d.duration(
            "rollup_retention", timedelta(days=90), minimum=timedelta(days=1)
        ),
        metrics_max_users=d.integer("metrics_max_users", 20, maximum=1000),
    )
    d.finish()
    s = _Reader(doc, text, path, "slurm")
    slurm = SlurmSettings(
        backend=s.string("backend", "auto", choices=BACKENDS),
        command_timeout=s.duration(
            "command_timeout", timedelta(seconds=30), minimum=timedelta(seconds=1)
        ),
        cluster=s.string("cluster", ""),
    )
    s.finish()
    policy = _parse_policy(doc, text, path, daemon.mode)
    notify = _parse_notify(doc, text, path)
    return Settings(daemon=daemon, slurm=slurm, policy=policy, notify=notify, source=path)


def _listen(reader: _Reader, key: str, default: str) -> str:
    """The API's HOST:PORT, checked now (:func:`slurmgpu.listen_address.parse_listen`),
    not when the daemon first binds it."""
    value = reader.string(key, default)
    try:
        parse_listen(value)
    except ValueError as exc:
        raise reader.fail(
            key, f'must be HOST:PORT like "127.0.0.1:8787", not {value[:80]!r}: {exc}'
        ) from None
    return value


def _uids(reader: _Reader, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    if key not in reader.raw:
        return default
    value = reader.raw.pop(key)
    ok = isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32 for v in value
    )
    if not ok:
        raise reader.fail(key, f"must be a list of uids like [0, 1001], not {value!r}")
    return tuple(value)


_POLICY_TABLES = ("engine", "rightsize", "idle_gpu", "colocate", "malleable", "las", "resize")


def _parse_policy(doc: dict[str, Any], text: str, path: Path | None, mode: str) -> PolicySettings:
    from slurmgpu.policy.settings import (
        AttainedServiceSettings,
        ColocateSettings,
        EngineSettings,
        IdleGpuSettings,
        MalleableSettings,
        PolicyConfigError,
        RightsizeSettings,
        sizing_from_mappings,
    )

    raw = doc.get("policy", {})
    if not isinstance(raw, dict):
        raise ConfigError("[policy] must be a table", path=path, line=_key_line(text, "", "policy"))
    top = {k: v for k, v in raw.items() if k not in _POLICY_TABLES}
    tables: dict[str, dict[str, Any]] = {}
    for name in _POLICY_TABLES:
        value = raw.get(name, {})
        if not isinstance(value, dict):
            raise ConfigError(
                f"[policy.{name}] must be a table", path=path, line=_key_line(text, "policy", name)
            )
        tables[name] = dict(value)
    for name in ("rightsize", "idle_gpu", "colocate", "malleable", "las"):
        tables[name].setdefault("mode", mode)
    reader = _Reader({"policy": top}, text, path, "policy")
    history_days = reader.integer("history_days", 90, minimum=1, maximum=MAX_HISTORY_DAYS)
    history_refresh = reader.duration(
        "history_refresh", timedelta(minutes=10), minimum=timedelta(seconds=1)
    )
    recommendations = reader.string("recommendations_file", "")
    reader.finish()
    resize = _parse_resize(tables["resize"], text, path)
    try:
        sizing, rightsize, colocate = sizing_from_mappings(tables["rightsize"], tables["colocate"])
        return PolicySettings(
            engine=EngineSettings.from_mapping(tables["engine"], "policy.engine"),
            sizing=sizing,
            rightsize=RightsizeSettings.from_mapping(rightsize, "policy.rightsize"),
            idle_gpu=IdleGpuSettings.from_mapping(tables["idle_gpu"], "policy.idle_gpu"),
            colocate=ColocateSettings.from_mapping(colocate, "policy.colocate"),
            malleable=MalleableSettings.from_mapping(tables["malleable"], "policy.malleable"),
            las=AttainedServiceSettings.from_mapping(tables["las"], "policy.las"),
            resize=resize,
            history_days=history_days,
            history_refresh=history_refresh,
            recommendations_file=recommendations,
        )
    except PolicyConfigError as exc:
        raise ConfigError(
            str(exc),
            path=path,
            line=_key_line(text, exc.where, exc.key),
            table=exc.where,
            key=exc.key,
        ) from None


def _parse_resize(raw: dict[str, Any], text: str, path: Path | None) -> ResizeSettings:
    """``[policy.resize]``: how resize transactions are paced (see ResizeSettings)."""
    from slurmgpu.cycle.resize import ResizeSettings

    r = _Reader({"policy.resize": raw}, text, path, "policy.resize")
    d = ResizeSettings()
    ack: timedelta | None = None
    if r.raw.get("ack_timeout") != "grace":
        ack = r.duration("ack_timeout", timedelta(0), minimum=timedelta(seconds=1)) or None
    else:
        r.raw.pop("ack_timeout")
    within = d.requeue_within
    if "requeue_within" in r.raw:
        value = r.raw.pop("requeue_within")
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not 0 < value <= 1:
            raise r.fail("requeue_within", f"must be a number in (0, 1], not {value!r}")
        within = float(value)
    settings = ResizeSettings(
        ack_timeout=ack,
        requeue_within=within,
        fast_start=r.boolean("fast_start", d.fast_start),
        shrink_in_place=r.boolean("shrink_in_place", d.shrink_in_place),
        release_delay=r.duration("release_delay", d.release_delay),
        release_after=r.duration("release_after", d.release_after, minimum=timedelta(seconds=1)),
        overtaken_after=r.duration(
            "overtaken_after", d.overtaken_after, minimum=timedelta(seconds=1)
        ),
        cycle_interval=r.duration(
            "cycle_interval", d.cycle_interval, minimum=timedelta(milliseconds=100)
        ),
    )
    r.finish()
    return settings


def _parse_notify(doc: dict[str, Any], text: str, path: Path | None) -> NotifySettings:
    from slurmgpu.notify.settings import NotifyConfigError, NotifySettings

    raw = doc.get("notify", {})
    if not isinstance(raw, dict):
        raise ConfigError("[notify] must be a table", path=path, line=_key_line(text, "", "notify"))
    try:
        return NotifySettings.from_mapping(raw)
    except NotifyConfigError as exc:
        dotted = exc.key or ""
        key = dotted.split(".")[-1]
        table = "notify" + ("." + ".".join(dotted.split(".")[:-1]) if "." in dotted else "")
        raise ConfigError(
            exc.reason if hasattr(exc, "reason") else str(exc),
            path=path,
            line=_key_line(text, table, key),
            table=table,
            key=key,
        ) from None


def load_settings(path: Path | None = None) -> Settings:
    """Return settings from ``path``, ``$SGPU_CONFIG`` or /etc/slurmgpu/config.toml if present.

    ``$SGPU_DB`` overrides the database URL from the file.
    """
    from_env = os.environ.get("SGPU_CONFIG") or None  # an empty variable means unset
    explicit = path is not None or from_env is not None
    candidate = path or Path(from_env or DEFAULT_CONFIG_PATH)
    settings = Settings()
    if candidate.exists() or explicit:
        try:
            text = candidate.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the file: {exc.strerror}", path=candidate) from None
        except UnicodeDecodeError:
            raise ConfigError("the file is not UTF-8 text", path=candidate) from None
        settings = parse_settings(text, candidate)
    if os.environ.get("SGPU_DB"):
        settings = settings.with_database(os.environ["SGPU_DB"])
    return settings
