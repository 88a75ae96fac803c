"""Core: the errors the core raises. Each names the field and the rule it broke."""

from __future__ import annotations


class SpecError(ValueError):
    """An input (action, env, service or node spec) broke a rule.

    ``field`` is the dotted name of the offending field, ``rule`` says what it must satisfy.
    """

    def __init__(self, field: str, rule: str, value: object = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        super().__init__(f"{field}: {rule} (got {value!r})")


class InvariantError(AssertionError):
    """The cluster state broke an invariant (a bug in a policy or in state bookkeeping)."""
