"""Shell: configuration of the CPU manager and of one sandbox, with input validation that
names the field and the rule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from arl_tangram.managers.cpu.cgroup_kill import KILL_GRACE_S
from arl_tangram.managers.cpu.errors import InvalidRequestError
from arl_tangram.managers.cpu.rootfs import ImageRoot

#: host paths bound read-only into every sandbox (the rest of the host, /root and /home
#: included, is simply absent); missing ones are skipped, symlinks are reproduced
DEFAULT_RO_BINDS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
MAX_TIMEOUT_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class SandboxSpec:
    """Limits of one sandbox. ``mem_bytes`` covers every process and the tmpfs pages they
    write; ``pids_max`` bounds tasks (a fork bomb stops there); ``workspace_bytes`` and
    ``tmp_bytes`` size the private tmpfs mounts. ``root``: None runs on the host's read-only
    root; an ``ImageRoot`` runs on an overlay of the image's layers (see ``rootfs``)."""

    mem_bytes: int = 1 << 30
    pids_max: int = 512
    workspace_bytes: int = 512 << 20
    tmp_bytes: int = 256 << 20
    root: ImageRoot | None = None

    def __post_init__(self) -> None:
        _positive_int("spec.mem_bytes", self.mem_bytes, minimum=16 << 20)
        _positive_int("spec.pids_max", self.pids_max, minimum=8)
        _positive_int("spec.workspace_bytes", self.workspace_bytes, minimum=1 << 20)
        _positive_int("spec.tmp_bytes", self.tmp_bytes, minimum=1 << 20)
        if self.root is not None and not isinstance(self.root, ImageRoot):
            raise InvalidRequestError("spec.root", "must be an ImageRoot or None (the host root)", type(self.root).__name__)


@dataclass(frozen=True)
class CpuManagerConfig:
    """Node-level settings. ``pool_size`` sandboxes of ``default_spec`` are kept warm.
    ``unisolated=True`` runs without cgroups (no limits, no accounting, no freezing): a
    development mode only, announced with a warning at start."""

    pool_size: int = 0
    default_spec: SandboxSpec = field(default_factory=SandboxSpec)
    ro_binds: tuple[str, ...] = DEFAULT_RO_BINDS
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 64 << 20  # one file read, written, uploaded or downloaded
    max_transfer_bytes: int = 1 << 30  # all files of one upload or download together
    dev_bytes: int = 16 << 20  # the sandbox's /dev/shm (the rest of /dev is read-only)
    unisolated: bool = False
    cgroup_parent: str | None = None  # a delegated cgroup v2 directory; None: detect
    sandbox_uid: int = 1000
    host_uid: int = 65534
    host_gid: int = 65534
    kill_grace_s: float = KILL_GRACE_S  # a timed-out action's processes are gone within this
    # arm a launcher in each freed slot between bursts (``armed``): an exec spaced from the
    # last one skips its cgroup joins (12 -> 3 ms measured); off by default until the suite's
    # module-scoped managers and leftover checks account for armed launchers
    arm_launchers: bool = False

    def __post_init__(self) -> None:
        _positive_int("config.pool_size", self.pool_size, minimum=0)
        if not isinstance(self.kill_grace_s, int | float) or isinstance(self.kill_grace_s, bool) or not 0 < self.kill_grace_s <= 60:
            raise InvalidRequestError("config.kill_grace_s", "must be a number of seconds in (0, 60]", self.kill_grace_s)
        _positive_int("config.max_output_bytes", self.max_output_bytes, minimum=1)
        for name in ("max_file_bytes", "max_transfer_bytes", "dev_bytes"):
            _positive_int(f"config.{name}", getattr(self, name), minimum=1 << 10)
        for name in ("sandbox_uid", "host_uid", "host_gid"):
            _positive_int(f"config.{name}", getattr(self, name), minimum=1)


def _positive_int(field_name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidRequestError(field_name, f"must be an integer >= {minimum}", value)


def validate_cores(cores: object, host_cpus: int | None = None) -> int:
    """A grant of whole cores, at least 1 and (given ``host_cpus``) at most the usable cpus:
    a wider grant could not be backed by distinct cpus, and ``nproc`` could not report it."""
    _positive_int("cores", cores, minimum=1)
    assert isinstance(cores, int)
    if host_cpus is not None and cores > host_cpus:
        raise InvalidRequestError("cores", f"must be <= the {host_cpus} usable cpus of this node", cores)
    return cores


def validate_timeout(timeout_s: object) -> float:
    if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise InvalidRequestError("timeout_s", f"must be a number in (0, {MAX_TIMEOUT_S:.0f}]", timeout_s)
    return float(timeout_s)


def validate_command(command: object) -> tuple[str, ...]:
    """A shell string runs under ``bash -c``; a sequence is an argv run as is."""
    if isinstance(command, str):
        if not command.strip() or "\0" in command:
            raise InvalidRequestError("command", "must be a non-empty string without NUL bytes", command)
        return ("/bin/bash", "-c", command)
    if not isinstance(command, Sequence) or not command or not all(isinstance(a, str) and "\0" not in a for a in command):
        raise InvalidRequestError("command", "must be a string or a non-empty sequence of strings without NUL", command)
    if "=" in command[0]:
        raise InvalidRequestError("command[0]", "must not contain '='", command[0])
    return tuple(command)


def validate_env(env: object) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise InvalidRequestError("env", "must be a mapping of str to str", env)
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise InvalidRequestError(f"env[{key!r}]", "name must be a non-empty string without '=' or NUL", key)
        if not isinstance(value, str) or "\0" in value:
            raise InvalidRequestError(f"env[{key!r}]", "value must be a string without NUL", value)
        out[key] = value
    return out


def validate_stdin(stdin: object) -> bytes | None:
    if stdin is None:
        return None
    if isinstance(stdin, str):
        return stdin.encode()
    if isinstance(stdin, bytes | bytearray | memoryview):
        return bytes(stdin)
    raise InvalidRequestError("stdin", "must be bytes, str or None", type(stdin).__name__)
