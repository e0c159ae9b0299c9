"""Slurm's ``priority/multifactor`` with Fair Tree, as SimSlurm's queue order.

Without it SimSlurm orders pending jobs by submission (``priority/basic``). A site that
weighs fair share (the site lab does: ``slurmgpu.lab.cluster.site``) starts jobs in a
different order, and a replay held against it must too (issue 33). What is modelled,
from Slurm's ``priority_multifactor.c`` and ``fair_tree.c`` and checked against the
22.05 site lab's ``sshare -l`` and ``squeue %Q``:

* **Usage.** Each association's raw usage grows by its jobs' billing x seconds run
  (``billing``: 1 per job, what ``CR_Core_Memory`` with no ``TRESBillingWeights`` bills a
  one-CPU job; or per GPU), and decays by ``2^(-period / half_life)`` every calculation
  period. An account's usage is its users'.
* **Level fair share** of an association: its shares over its siblings' (NormShares)
  divided by its usage over its siblings' (EffectvUsage); no usage is infinitely
  deserving.
* **Fair Tree ranking.** Siblings are visited in decreasing level fair share (users
  before accounts on a tie), depth first; each user in turn takes the next rank,
  counted down from the number of users; a user tied with its previous sibling shares
  its rank (the next one skips), and so does the first user under an account tied with
  its previous sibling (``_calc_tree_fs``' ``account_tied``): with no usage anywhere
  every user ties at 1.0. A user's factor is rank / users. Users that are direct
  children of ``root`` (``root`` itself, the daemon's user) count like any user.
* **Priority** = ``base + weight x factor + qos - nice``, floored at 1; recomputed once
  per calculation period (``PriorityCalcPeriod``), which is also when a pending job's
  priority changes; a new job gets the factors of the last calculation.

Age (``PriorityWeightAge`` over ``PriorityMaxAge``, 7 days by default) and job size are
left out: the site's weights make them negligible or zero.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurmgpu.sim.slurm import SimSlurm
    from slurmgpu.sim.state import SimJob

__all__ = ["FairShareConfig", "FairShareError", "FairTree", "fair_tree_factors", "parse_fairshare"]


class FairShareError(ValueError):
    """A fair-share description that cannot be used; one line naming where and what."""


@dataclass(frozen=True, slots=True)
class FairShareConfig:
    """A site's accounts and priority weights, in the simulator's (trace) seconds.

    ``accounts``: account -> RawShares (children of ``root``); ``users``: user -> its
    account; ``root_users``: users directly under ``root`` (each with 1 share) that run no
    jobs in the trace but take a rank. A job whose user is not listed belongs to an
    account named after the user, with ``default_shares``.
    """

    accounts: Mapping[str, int]
    users: Mapping[str, str]
    root_users: tuple[str, ...] = ()
    weight_fairshare: float = 100000.0
    base: float = 0.0  # PriorityWeightPartition x the partition's factor, and the QOS term
    billing: str = "job"  # "job": one per job (one CPU each); "gpu": one per GPU
    calc_period_s: float = 300.0  # PriorityCalcPeriod (Slurm's default: 5 minutes)
    half_life_s: float = 7 * 86400.0  # PriorityDecayHalfLife (default 7 days)
    default_shares: int = 1
    user_shares: Mapping[str, int] = field(default_factory=dict)  # default 1 each
    # raw usage each user starts with (seconds x billing): what earlier work left in the
    # site's database (a replay's earlier sets ran on the same lab)
    usage: Mapping[str, float] = field(default_factory=dict)
    # when the first calculation falls (the simulator's clock): Slurm's decay thread runs
    # every calc_period from slurmctld's start, whatever the jobs; None: one period after
    # the first time a priority is asked for
    first_calc_s: float | None = None

    def __post_init__(self) -> None:
        if not self.calc_period_s > 0 or not math.isfinite(self.calc_period_s):
            raise ValueError(f"calc_period_s must be > 0, not {self.calc_period_s}")
        if not self.half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, not {self.half_life_s}")
        if self.billing not in ("job", "gpu"):
            raise ValueError(f"billing must be 'job' or 'gpu', not {self.billing!r}")
        if any(not u >= 0 or not math.isfinite(u) for u in self.usage.values()):
            raise ValueError("usage must be numbers >= 0")
        for account, shares in self.accounts.items():
            if shares < 0:
                raise ValueError(f"account {account}: shares must be >= 0, not {shares}")

    def tree(self) -> tuple[dict[str, int], dict[str, list[tuple[str, int]]]]:
        """Account -> shares (an account named only by a user: ``default_shares``) and
        account -> its users with their shares: what :func:`fair_tree_factors` takes."""
        accounts = dict(self.accounts)
        members: dict[str, list[tuple[str, int]]] = {a: [] for a in self.accounts}
        for user, account in self.users.items():
            accounts.setdefault(account, self.default_shares)
            members.setdefault(account, []).append((user, self.user_shares.get(user, 1)))
        return accounts, members

    def factors(self, usage: Mapping[str, float]) -> dict[str, float]:
        """Each listed user's fair-share factor under ``usage`` (user -> raw usage)."""
        accounts, members = self.tree()
        return fair_tree_factors(accounts, members, self.root_users, usage)


def _level_fs(shares: float, total_shares: float, usage: float, total_usage: float) -> float:
    norm_shares = shares / total_shares if total_shares > 0 else 0.0
    if norm_shares <= 0:
        return 0.0  # no shares: the lowest level fair share, whatever the usage
    if usage <= 0 or total_usage <= 0:
        return math.inf
    return norm_shares / (usage / total_usage)


def fair_tree_factors(
    accounts: Mapping[str, int],
    account_users: Mapping[str, Iterable[tuple[str, int]]],
    root_users: Iterable[str],
    usage: Mapping[str, float],
) -> dict[str, float]:
    """Each user's Fair Tree fair-share factor (0 < f <= 1). ``account_users``: account
    -> (user, shares); ``usage``: user -> raw (decayed) usage."""
    # root's children: the accounts and the users directly under root (1 share each)
    root_users = list(root_users)
    acct_usage = {a: sum(usage.get(u, 0.0) for u, _ in account_users.get(a, ())) for a in accounts}
    root_children: list[tuple[str, bool, float, float]] = [
        (a, True, float(s), acct_usage[a]) for a, s in accounts.items()
    ]
    root_children += [(u, False, 1.0, usage.get(u, 0.0)) for u in root_users]
    total_users = sum(len(list(account_users.get(a, ()))) for a in accounts) + len(root_users)
    factors: dict[str, float] = {}
    rank = rnt = total_users  # the current rank; the rank were there no ties

    def visit(children: list[tuple[str, bool, float, float]], account_tied: bool) -> None:
        # fair_tree.c's _calc_tree_fs: siblings by level fair share, users before
        # accounts on a tie; a user tied with the previous sibling (or first below an
        # account tied with its previous sibling) keeps the current rank, else takes the
        # rank it would have without ties. Tied accounts are visited one after another:
        # _count_tied_accounts stops at the first account, so none is merged (22.05
        # through 26.05).
        nonlocal rank, rnt
        total_s = sum(c[2] for c in children)
        total_u = sum(c[3] for c in children)
        scored = sorted(
            (
                (_level_fs(s, total_s, u, total_u), name, is_acct)
                for name, is_acct, s, u in children
            ),
            key=lambda t: (-t[0], t[2], t[1]),
        )
        prev: float | None = None
        for i, (level, name, is_acct) in enumerate(scored):
            tied = True if i == 0 and account_tied else prev == level
            if not is_acct:
                if not tied:
                    rank = rnt
                factors[name] = rank / total_users if total_users else 0.0
                rnt -= 1
            else:
                visit(
                    [
                        (u, False, float(s), usage.get(u, 0.0))
                        for u, s in account_users.get(name, ())
                    ],
                    tied,
                )
            prev = level

    visit(root_children, False)
    return factors


class FairTree:
    """SimSlurm's priority key under ``config``: lower sorts first, so the key is the
    negated priority. Usage is read off the jobs' runs in SimSlurm at each period."""

    def __init__(self, sim: SimSlurm, config: FairShareConfig) -> None:
        self.sim = sim
        self.config = config
        self.usage: dict[str, float] = dict(config.usage)
        self.factors: dict[str, float] = {}
        self._account_of: dict[str, str] = dict(config.users)
        self._accounts, self._members = config.tree()
        self._tick: float | None = None  # the last calculation's time
        self._decay = 0.5 ** (config.calc_period_s / config.half_life_s)
        self._recalc()

    def _user(self, job: SimJob) -> str:
        user = job.user
        if user not in self._account_of:
            account = job.account or user
            self._account_of[user] = account
            self._accounts.setdefault(account, self.config.default_shares)
            self._members.setdefault(account, []).append((user, 1))
            self._recalc()
        return user

    def _recalc(self) -> None:
        self.factors = fair_tree_factors(
            self._accounts, self._members, self.config.root_users, self.usage
        )

    def _billing(self, run_gpus: float) -> float:
        return 1.0 if self.config.billing == "job" else run_gpus

    def _advance(self, now: float) -> None:
        period = self.config.calc_period_s
        if self._tick is None:
            first = self.config.first_calc_s
            if first is None:
                self._tick = now
                return
            self._tick = first - period  # the previous calculation: nothing ran before it
        while self._tick + period <= now:
            lo, hi = self._tick, self._tick + period
            added: dict[str, float] = {}
            for job in self._touched(lo):
                for run in job.runs:
                    end = run.end_s if not math.isnan(run.end_s) else hi
                    overlap = min(end, hi) - max(run.start_s, lo)
                    if overlap > 0:
                        user = self._user(job)
                        added[user] = added.get(user, 0.0) + self._billing(run.gpus) * overlap
            for user in set(self.usage) | set(added):
                self.usage[user] = self.usage.get(user, 0.0) * self._decay + added.get(user, 0.0)
            self._tick = hi
            self._recalc()

    def _touched(self, since: float) -> Iterable[SimJob]:
        """Jobs that may have run after ``since``: running, requeued or ended since."""
        for job in self.sim.running():
            yield job
        for job in self.sim.pending():  # requeued: a run that ended after ``since``
            if job.runs and job.runs[-1].end_s > since:
                yield job
        for job in reversed(self.sim.finished):  # in end order: stop at the first before
            if job.end_s <= since:
                break
            yield job

    def priority(self, job: SimJob, now: float) -> float:
        """The job's priority now, as ``squeue %Q`` would show it."""
        self._advance(now)
        user = self._user(job)
        value = self.config.base + self.config.weight_fairshare * self.factors.get(user, 0.0)
        return max(1.0, value - job.nice)

    def __call__(self, job: SimJob, now: float) -> tuple[float, ...]:
        return (-self.priority(job, now),)


_NUMBERS = {
    "calc_period": "calc_period_s",
    "half_life": "half_life_s",
    "weight": "weight_fairshare",
    "base": "base",
}


def parse_fairshare(text: str, origin: str) -> FairShareConfig:
    """A site's fair share from TOML ``text`` (``origin``: the file, for messages)::

        calc_period = 300        # PriorityCalcPeriod, seconds (default 300)
        half_life = 604800       # PriorityDecayHalfLife, seconds (default 7 days)
        weight = 100000          # PriorityWeightFairshare
        base = 0                 # what every job adds (partition, QOS terms)
        billing = "job"          # "job" (one CPU per job) or "gpu"
        root_users = ["root"]    # users directly under root
        [accounts]               # sacctmgr's fairshare= of each account under root
        physics = 50
        [users]                  # user -> account; a user not listed is an account of
        alice = "physics"        # its own (its job's account, if the trace names one)

    Raises FairShareError with one line naming the file and what is wrong.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FairShareError(f"{origin}: not TOML: {exc}") from None
    known = {*_NUMBERS, "billing", "root_users", "accounts", "users"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise FairShareError(
            f"{origin}: unknown key {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    accounts = doc.get("accounts", {})
    users = doc.get("users", {})
    root_users = doc.get("root_users", [])
    if not isinstance(accounts, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in accounts.values()
    ):
        raise FairShareError(f"{origin}: [accounts] must map account names to integer shares")
    if not isinstance(users, dict) or not all(isinstance(v, str) for v in users.values()):
        raise FairShareError(f"{origin}: [users] must map user names to account names")
    if not isinstance(root_users, list) or not all(isinstance(u, str) for u in root_users):
        raise FairShareError(f"{origin}: root_users must be a list of user names")
    numbers: dict[str, float] = {}
    for key, field_name in _NUMBERS.items():
        if key in doc:
            value = doc[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise FairShareError(f"{origin}: {key} must be a number, not {value!r}")
            numbers[field_name] = float(value)
    billing = doc.get("billing", "job")
    if not isinstance(billing, str):
        raise FairShareError(f'{origin}: billing must be "job" or "gpu", not {billing!r}')
    try:
        return FairShareConfig(
            accounts=accounts,
            users=users,
            root_users=tuple(root_users),
            billing=billing,
            **numbers,  # type: ignore[arg-type]
        )
    except ValueError as exc:
        raise FairShareError(f"{origin}: {exc}") from None
