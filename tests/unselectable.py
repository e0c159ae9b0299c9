"""Test files the ``-m`` expression can select nothing from, left uncollected.

Collecting a module imports it: ``tests/integration`` imports torch, transformers and
Lightning (about 3 s per xdist worker), ``tests/slurm`` the lab harness, and the scans
of the source tree run at import too. The unit tier (``-m "not slow and not slurm and
not docker"``) deselects all of them anyway, after paying for the import. A directory
whose tests all carry a tier mark (``tests/conftest.py``'s ``_TIER_OF_DIR``) or a module
whose plain ``pytestmark`` gives every test a mark is left out when no test carrying
those marks can match the expression, whatever other marks it has.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Callable, Collection

from _pytest.mark.expression import Expression

__all__ = ["module_marks", "selects_none"]

_KEYWORDS = frozenset({"and", "or", "not", "True", "False"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# ``pytestmark = pytest.mark.slow`` or ``pytestmark = [pytest.mark.slow, pytest.mark.x]``,
# on one line at module level; a mark with arguments (skipif) is no tier.
_PYTESTMARK = re.compile(r"^pytestmark = (\[[^\]\n]*\]|pytest\.mark\.\w+)[ \t]*(#.*)?$", re.M)
_BARE_MARK = re.compile(r"pytest\.mark\.(\w+)(?![\w(])")


def module_marks(text: str) -> frozenset[str]:
    """The marks a module's one-line ``pytestmark`` gives every test in it (the text is
    parsed only where such a line is seen, to tell a statement from a string's line)."""
    if _PYTESTMARK.search(text) is None:
        return frozenset()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return frozenset()  # collected as usual: pytest reports the error
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [ast.unparse(t) for t in node.targets] == ["pytestmark"]
            and (found := _PYTESTMARK.fullmatch(f"pytestmark = {ast.unparse(node.value)}"))
        ):
            return frozenset(_BARE_MARK.findall(found.group(1)))
    return frozenset()


def _carrying(marks: set[str]) -> Callable[..., bool]:
    """pytest's matcher for a test carrying exactly ``marks`` (mark arguments ignored)."""

    def matches(name: str, /, **_: object) -> bool:
        return name in marks

    return matches


def selects_none(markexpr: str, marks: Collection[str]) -> bool:
    """True when no test carrying every mark in ``marks`` (and any others) can match
    ``markexpr``; False where it might, or where the expression does not compile."""
    if not markexpr or not marks:
        return False
    try:
        expression = Expression.compile(markexpr)
    except SyntaxError:  # pytest reports a bad -m itself
        return False
    others = sorted(set(_NAME.findall(markexpr)) - _KEYWORDS - set(marks))
    if len(others) > 10:
        return False  # not worth 2**n evaluations
    for values in itertools.product((False, True), repeat=len(others)):
        carried = set(marks) | {n for n, v in zip(others, values, strict=True) if v}
        if expression.evaluate(_carrying(carried)):
            return False
    return True
