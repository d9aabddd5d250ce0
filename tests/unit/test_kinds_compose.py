"""Kinds compose instead of undoing: a method that overrides an inherited one with a bare `return None` (or `[]`,
`()`, `False`, `0`) says the base holds two things and the subclass wants only one. The refusal and removal kinds
share an eager kind on the tensor kind's forward (harness.kinds.on_forward) and override nothing that way, nor does
that base undo `Kind`; the check sees such an override where one is written (its negative control)."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from harness.kinds import Kind, kind_of
from harness.kinds.tensor import TensorKind


def _returns_empty(function) -> bool:
    """Whether the function's whole body, its docstring aside, returns an empty literal (None, [], (), False, 0)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0].body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Return):
        return False
    try:
        value = None if body[0].value is None else ast.literal_eval(body[0].value)
    except ValueError:  # not a literal: behaviour of its own
        return False
    return not value


def undoing(cls: type) -> list[str]:
    """`Class.method` for each method of `cls` or of a base below `Kind` that overrides an inherited method with an
    empty return."""
    mro = cls.__mro__
    return [f"{owner.__name__}.{name}" for owner in mro[:mro.index(Kind)] for name, member in vars(owner).items()
            if inspect.isfunction(member) and any(name in vars(base) for base in owner.__mro__[1:])
            and _returns_empty(member)]


@pytest.mark.parametrize("name", ["refusal", "removal"])
def test_refusal_and_removal_override_nothing_to_undo(name):
    assert undoing(type(kind_of(name))) == []


def test_an_override_that_undoes_its_base_is_seen():
    class Undoing(TensorKind):
        def policy(self, settings, dtype):
            """Not judged by limits."""
            return None

        def draws_for(self, case):
            return ()

        def rank_tolerance(self, policy):
            return 0.0

        def applies(self, layout):  # an answer of its own, not an undo
            return layout.tp > 1

        def repro_refusal(self, case):  # text of its own
            return "not scripted"

    assert undoing(Undoing) == ["Undoing.policy", "Undoing.draws_for", "Undoing.rank_tolerance"]
