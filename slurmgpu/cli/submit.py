"""``sgpu submit``: a faithful sbatch wrapper that tells slurmgpu what a job agrees to.

Every argument after ``submit`` goes to sbatch unchanged, as an argument list (never
through a shell). sbatch runs as the caller, so slurmgpu never gains privileges here.
What slurmgpu needs rides in the job's ``--comment`` as ``sgpu:`` tokens; nothing is
written to the daemon's store, which is the daemon's alone: the daemon records the
submission from Slurm's view of the job when it first sees it
(slurmgpu/store/submission_record.py), so a user can record only their own job.

slurmgpu's own options (not sbatch's) are taken out before the batch script:

- ``--rightsize``: opt this job in to rightsizing (adds the token ``sgpu:rightsize`` to
  the job's comment, which job_submit.lua and the daemon both read).
- ``--shareable``: the job may share its GPU with other light jobs (token
  ``sgpu:shareable``; the co-location policy decides, see docs/policies.md).
- ``--gpu-mem SIZE`` (``8GiB``, ``512MiB``): the most GPU memory the job will use (token
  ``sgpu:gpu-mem=MiB``), which co-location needs to know before packing a job.
- ``--malleable MIN:MAX``: the job may be resized between MIN and MAX GPUs (token
  ``sgpu:malleable=MIN:MAX``). Adds ``--requeue`` and, unless given,
  ``--signal=B:SIG@GRACE`` (the checkpoint signal before the time limit); passes
  ``SGPU_CHECKPOINT_SIGNAL``, ``SGPU_CHECKPOINT_HOLD`` and ``SGPU_ELASTIC_DIR`` to the
  job for its ``slurmgpu.elastic`` runtime; adds ``--open-mode=append`` (the log carries
  on across requeues); a ``--wrap`` command runs under ``exec sgpu launch --``, and a
  script that starts torchrun without it is refused (slurmgpu/cli/launchwrap.py).
  ``--checkpoint-signal SIG`` (default ``USR2``), ``--checkpoint-grace 120s`` (how long
  the job may take to checkpoint, and waits after it), ``--elastic-dir DIR`` (default
  ``./.sgpu-elastic``; must be visible from the head node) go with it.
- ``--pool`` with ``--array A-B%K``: a worker pool whose concurrency is malleable
  between ``--malleable MIN:MAX`` tasks (default 1 to the number of tasks); token
  ``sgpu:pool=MIN:MAX``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import click
import click.shell_completion

from slurmgpu.checkpoint_signal import MAX_GRACE_S, MIN_GRACE_S
from slurmgpu.cli.context import EXIT_SLURM, AppContext, fail, pass_app
from slurmgpu.cli.launchwrap import check_script, wrap_command
from slurmgpu.slurm import sbatch
from slurmgpu.slurm.client import SlurmCommandError, SlurmError
from slurmgpu.tokens import (
    RIGHTSIZE,
    SHAREABLE,
    add_to_comment,
    ckpt_tokens,
    gpu_mem_token,
    malleable_token,
)
from slurmgpu.units import parse_size_mib

SGPU_FLAGS = frozenset({"--rightsize", "--shareable", "--pool"})
DEFAULT_ELASTIC_DIR = ".sgpu-elastic"
GPU_MEM_OPTION = "--gpu-mem"


def take_gpu_mem(args: tuple[str, ...]) -> tuple[int | None, tuple[str, ...]]:
    """Return (MiB of ``--gpu-mem SIZE`` / ``--gpu-mem=SIZE`` before the script, the rest).

    Raises ValueError for a missing or malformed size.
    """
    mib: int | None = None
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == GPU_MEM_OPTION or arg.startswith(GPU_MEM_OPTION + "="):
            if "=" in arg:
                value = arg.split("=", 1)[1]
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                raise ValueError("--gpu-mem needs a size like 8GiB")
            mib = parse_size_mib(value)
        else:
            rest.append(arg)
            if not arg.startswith("-") and os.path.isfile(arg):
                rest.extend(args[i + 1 :])
                break
        i += 1
    return mib, tuple(rest)


MALLEABLE_OPTIONS = ("--malleable", "--checkpoint-signal", "--checkpoint-grace", "--elastic-dir")


def take_values(
    args: tuple[str, ...], names: tuple[str, ...]
) -> tuple[dict[str, str], tuple[str, ...]]:
    """Take ``--name VALUE`` / ``--name=VALUE`` options (before the script) out of ``args``."""
    found: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name = next((n for n in names if arg == n or arg.startswith(n + "=")), None)
        if name is not None:
            if "=" in arg:
                found[name] = arg.split("=", 1)[1]
            elif i + 1 < len(args):
                i += 1
                found[name] = args[i]
            else:
                raise ValueError(f"{name} needs a value")
        else:
            rest.append(arg)
            if not arg.startswith("-") and os.path.isfile(arg):
                rest.extend(args[i + 1 :])
                break
        i += 1
    return found, tuple(rest)


def _sbatch_option(args: list[str], *names: str) -> str | None:
    """The value of an sbatch option given before the script (``--array=0-9%2``, ``-a X``)."""
    for i, arg in enumerate(args):
        if not arg.startswith("-") and os.path.isfile(arg):
            return None
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def array_task_count(spec: str) -> int:
    """Tasks in an ``--array`` spec (``0-9%2``, ``1,3,5-7``, ``0-15:4``)."""
    body = spec.split("%", 1)[0]
    count = 0
    for piece in body.split(","):
        span, _, step_text = piece.partition(":")
        step = int(step_text) if step_text else 1
        if "-" in span:
            lo, hi = span.split("-", 1)
            count += len(range(int(lo), int(hi) + 1, max(step, 1)))
        else:
            int(span)
            count += 1
    if count < 1:
        raise ValueError(f"--array {spec!r} has no tasks")
    return count


@dataclass(frozen=True, slots=True)
class MalleableRequest:
    lo: int
    hi: int
    pool: bool
    signal: str
    grace_s: int
    elastic_dir: str


def malleable_request(values: dict[str, str], pool: bool, args: list[str]) -> MalleableRequest:
    """Validate our malleable options; ValueError with a one-line reason."""
    from slurmgpu.checkpoint_signal import checkpoint_signal
    from slurmgpu.config import parse_duration
    from slurmgpu.elastic.spec import parse_range

    array = _sbatch_option(args, "--array", "-a")
    if pool and array is None:
        raise ValueError("--pool needs --array A-B%K (the pool's tasks)")
    if "--malleable" in values:
        lo, hi = parse_range(values["--malleable"])
    elif pool and array is not None:
        try:
            lo, hi = 1, array_task_count(array)
        except ValueError:
            raise ValueError(f"--array {array!r} is not an array spec like 0-9%2") from None
    else:
        raise ValueError("--checkpoint-signal/--checkpoint-grace/--elastic-dir need --malleable")
    try:
        sig = checkpoint_signal(values.get("--checkpoint-signal", "USR2"))
    except ValueError as exc:
        raise ValueError(f"--checkpoint-signal: {exc}") from None
    own = _sbatch_option(args, "--signal")
    if own is not None:  # kept instead of ours: the time limit's checkpoint request
        flags, _, rest = own.rpartition(":")
        try:
            checkpoint_signal(rest.split("@", 1)[0])
            if flags.strip("RB"):
                raise ValueError(f"{flags!r} is not R, B or RB")
        except ValueError as exc:
            raise ValueError(f"--signal {own[:40]!r} of a malleable job: {exc}") from None
    grace = parse_duration(values.get("--checkpoint-grace", "120s"))
    grace_s = int(grace.total_seconds())
    if not MIN_GRACE_S <= grace_s <= MAX_GRACE_S:  # what sbatch's --signal carries
        raise ValueError("--checkpoint-grace must be between 1s and 18h")
    elastic_dir = os.path.abspath(values.get("--elastic-dir", DEFAULT_ELASTIC_DIR))
    return MalleableRequest(lo, hi, pool, sig, grace_s, elastic_dir)


def malleable_args(req: MalleableRequest, args: list[str]) -> list[str]:
    """sbatch arguments for a malleable job or pool: token, --requeue, --signal, exec wrap."""
    out = add_comment_token(args, malleable_token(req.lo, req.hi, pool=req.pool))
    # The options ride in the comment too: the daemon reads them there for every user.
    for token in ckpt_tokens(req.signal, req.grace_s, req.elastic_dir):
        out = add_comment_token(out, token)
    head: list[str] = []
    if "--no-requeue" not in out:
        head.append("--requeue")
    if _sbatch_option(out, "--signal") is None:
        head.extend(sbatch.checkpoint_signal(req.signal, req.grace_s).argv)
    if _sbatch_option(out, "--open-mode") is None:
        head.append("--open-mode=append")  # a requeued run must not overwrite the log
    for i, arg in enumerate(out):
        if not arg.startswith("-") and os.path.isfile(arg):
            break
        wrap = None
        if arg == "--wrap" and i + 1 < len(out):
            wrap, at = out[i + 1], i + 1
        elif arg.startswith("--wrap="):
            wrap, at = arg.split("=", 1)[1], i
        if wrap is not None:  # run under `sgpu launch` (slurmgpu/cli/launchwrap.py)
            out[at] = ("--wrap=" if at == i else "") + wrap_command(wrap, req.signal)
            break
    return head + out


# slurmgpu's own options: (name, metavar or None for a flag, one line of help). The help
# text, the typo check and the parsers above all agree on these names.
SGPU_OPTIONS: tuple[tuple[str, str | None, str], ...] = (
    ("--rightsize", None, "Opt in to rightsizing (GPU request lowered)."),
    ("--shareable", None, "May share a GPU with light jobs (co-location)."),
    ("--gpu-mem", "SIZE", "Most GPU memory it uses, e.g. 8GiB."),
    ("--malleable", "MIN:MAX", "May be resized between MIN and MAX GPUs."),
    ("--pool", None, "With --array A-B%K: a pool of malleable width."),
    ("--checkpoint-signal", "SIG", "Signal that asks it to checkpoint [USR2]."),
    ("--checkpoint-grace", "DURATION", "Time it gets to checkpoint [120s]."),
    ("--elastic-dir", "DIR", "Shared dir for its state [./.sgpu-elastic]."),
)
SUBMIT_EXAMPLES = (
    "sgpu submit --rightsize --gres=gpu:2 -t 4:00:00 train.sh",
    "sgpu submit --shareable --gpu-mem 8GiB --gres=shard:4 --wrap 'python eval.py'",
    "sgpu submit --malleable 2:4 --gres=gpu:4 -t 24:00:00 train.sh",
    "sgpu submit --pool --array 0-99%8 --gres=gpu:1 worker.sh",
)


def misspelt_sgpu_option(args: tuple[str, ...]) -> tuple[str, str] | None:
    """Return (option given, sgpu option meant) for the first typo of one of our options.

    Only options before the script are looked at (sbatch stops at the first non-option
    too). An option sbatch knows (exactly or as a unique prefix, as getopt_long accepts
    it) is never a typo; an unknown one close to none of ours goes to sbatch unchanged.
    """
    import difflib

    from slurmgpu.cli import sbatch_options as sb

    ours = {name: metavar is not None for name, metavar, _ in SGPU_OPTIONS}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            return None  # the script (or stdin): the rest is the script's
        if arg.startswith("--"):
            name, has_value = arg.split("=", 1)[0], "=" in arg
            if name in ours:
                i += 2 if ours[name] and not has_value else 1
                continue
            known = sb.long_option(name)
            if known is not None:
                i += 2 if known in sb.LONG_WITH_VALUE and not has_value else 1
                continue
            close = difflib.get_close_matches(name, list(ours), n=1, cutoff=0.75)
            if close:
                return name, close[0]
            i += 1
            continue
        letter = arg[1]
        i += 2 if letter in sb.SHORT_WITH_VALUE and len(arg) == 2 else 1
    return None


class SubmitCommand(click.Command):
    """``sgpu submit``'s help: our own options first, then a word on sbatch's."""

    def shell_complete(
        self, ctx: click.Context, incomplete: str
    ) -> list[click.shell_completion.CompletionItem]:
        """Complete our options (with their help) and then sbatch's long options."""
        from click.shell_completion import CompletionItem

        from slurmgpu.cli.sbatch_options import LONG_OPTIONS

        if not incomplete.startswith("-"):
            return []
        ours = [
            CompletionItem(name, help=text)
            for name, _, text in SGPU_OPTIONS
            if name.startswith(incomplete)
        ]
        return ours + [
            CompletionItem(name) for name in sorted(LONG_OPTIONS) if name.startswith(incomplete)
        ]

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(
            ctx.command_path, "[SGPU OPTIONS] [SBATCH OPTIONS] [SCRIPT [ARGS]...]"
        )
        self.format_help_text(ctx, formatter)
        with formatter.section("sgpu options"):
            formatter.write_dl(
                [
                    (name + (f" {metavar}" if metavar else ""), text)
                    for name, metavar, text in SGPU_OPTIONS
                ]
                + [("-h, --help", "Show this message and exit.")]
            )
        with formatter.section("sbatch options"):
            formatter.write_text(
                "Every other option goes to sbatch unchanged (see `man sbatch`), and so does "
                "everything after the script. A misspelt sgpu option (--maleable) is refused "
                "with a suggestion, not passed on."
            )
        with formatter.section("Examples"):
            for line in SUBMIT_EXAMPLES:
                formatter.write(f"{'':>{formatter.current_indent}}{line}\n")


def _wants_parsable(args: tuple[str, ...]) -> bool:
    return any(a == "--parsable" for a in args)


def split_sgpu_options(args: tuple[str, ...]) -> tuple[set[str], list[str]]:
    """Return (slurmgpu flags, sbatch arguments): our flags count only before the script.

    The script is the first argument naming an existing file; everything after it belongs
    to the script, so a script's own ``--rightsize`` argument is left alone.
    """
    flags: set[str] = set()
    rest: list[str] = []
    for i, arg in enumerate(args):
        if arg in SGPU_FLAGS:
            flags.add(arg)
            continue
        rest.append(arg)
        if not arg.startswith("-") and os.path.isfile(arg):
            rest.extend(args[i + 1 :])
            break
    return flags, rest


def add_comment_token(args: list[str], token: str) -> list[str]:
    """Append ``token`` to the job's ``--comment`` (or add one), before the script; a
    token the comment already carries is not added again (``tokens.add_to_comment``)."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg.startswith("--comment="):
            out[i] = "--comment=" + add_to_comment(arg.removeprefix("--comment="), [token])
            return out
        if arg == "--comment" and i + 1 < len(out):
            out[i + 1] = add_to_comment(out[i + 1], [token])
            return out
        if not arg.startswith("-") and os.path.isfile(arg):
            break
    return [f"--comment={token}", *out]


@click.command(
    cls=SubmitCommand,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    add_help_option=False,
)
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
@pass_app
def submit(app: AppContext, sbatch_args: tuple[str, ...]) -> None:
    """Submit a batch job through sbatch, as you, with what slurmgpu needs in its comment.

    Prints "Submitted batch job N" like sbatch (just N with --parsable).
    """
    if sbatch_args in {("-h",), ("--help",)}:
        click.echo(click.get_current_context().get_help())
        return
    typo = misspelt_sgpu_option(sbatch_args)
    if typo is not None:
        fail(f"no such option {typo[0]}; did you mean {typo[1]}? (see sgpu submit --help)", 2)
    try:
        gpu_mem_mib, passed = take_gpu_mem(sbatch_args)
    except ValueError as exc:
        fail(f"--gpu-mem: {exc}", 2)
    try:
        values, passed = take_values(passed, MALLEABLE_OPTIONS)
    except ValueError as exc:
        fail(str(exc), 2)
    flags, args = split_sgpu_options(passed)
    malleable: MalleableRequest | None = None
    if values or "--pool" in flags:
        try:
            malleable = malleable_request(values, "--pool" in flags, args)
        except ValueError as exc:
            fail(str(exc), 2)
        script = next((a for a in args if not a.startswith("-") and os.path.isfile(a)), None)
        verdict = check_script(script) if script and not malleable.pool else None
        if verdict is not None and verdict.error:
            fail(f"--malleable: {verdict.error}", 2)
        if verdict is not None and verdict.note:
            click.echo(f"sgpu submit: note: {verdict.note}", err=True)
        args = malleable_args(malleable, args)
    if "--rightsize" in flags:
        args = add_comment_token(args, RIGHTSIZE)
    if "--shareable" in flags:
        args = add_comment_token(args, SHAREABLE)
    if gpu_mem_mib is not None:
        args = add_comment_token(args, gpu_mem_token(gpu_mem_mib))
    # sbatch reads the script from stdin when none is named; it inherits ours unchanged.
    slurm = app.slurm()
    env = None
    if malleable is not None:
        env = {
            "SGPU_CHECKPOINT_SIGNAL": malleable.signal,
            "SGPU_CHECKPOINT_HOLD": str(malleable.grace_s),
            "SGPU_ELASTIC_DIR": malleable.elastic_dir,
        }
    try:
        job_id = slurm.submit(args, cwd=os.getcwd(), env=env)
    except SlurmCommandError as exc:
        fail(f"sbatch refused the job: {exc}", EXIT_SLURM)
    except SlurmError as exc:
        fail(str(exc), EXIT_SLURM)
    click.echo(str(job_id) if _wants_parsable(sbatch_args) else f"Submitted batch job {job_id}")
