"""Shell: the errors the CPU manager raises; each says what broke and, for input, the rule."""

from __future__ import annotations


class CpuManagerError(RuntimeError):
    """Base class of every error raised by ``managers.cpu``."""


class InvalidRequestError(CpuManagerError, ValueError):
    """A caller's input broke a rule. ``field`` names the input, ``rule`` what it must satisfy."""

    def __init__(self, field: str, rule: str, value: object = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        super().__init__(f"{field}: {rule} (got {value!r})")


class ConflictError(InvalidRequestError):
    """Well-formed input that the sandbox's current state refuses: a missing directory, a
    directory where a file must be, a symlink on the way, a full workspace, a file over the
    read cap. (The HTTP API answers 409; it is still a ``ValueError`` for other callers.)"""


class CgroupUnavailableError(CpuManagerError):
    """cgroups cannot be used for isolation (not root, no delegation, missing controller).

    The manager refuses to start rather than run silently unlimited; the message says why
    and how to get the explicit ``unisolated=True`` development mode.
    """


class SandboxNotFoundError(CpuManagerError, KeyError):
    """No live sandbox (or session) has the given id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown sandbox"


class SandboxDeadError(CpuManagerError):
    """The sandbox's init process is gone (killed from outside, or destroyed)."""


class InvalidTransitionError(CpuManagerError):
    """A sandbox state machine was asked for an edge its transition table does not have."""
