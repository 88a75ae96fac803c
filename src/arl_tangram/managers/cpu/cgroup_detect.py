"""Shell: find which cgroup version this host runs and where the manager's groups go.

The parse functions are pure (they take file contents) so they are tested against recorded
host files; ``detect_driver`` reads ``/proc/self/cgroup`` and ``/proc/self/mountinfo``.
Rule: v1 when every v1 controller the manager needs is mounted as v1 and listed for this
process (hybrid hosts with an unused cgroup2 mount stay on v1); else v2 when a cgroup2 mount
holds the needed controllers; else ``CgroupUnavailableError``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from arl_tangram.managers.cpu.cgroup_driver import CgroupDriver
from arl_tangram.managers.cpu.cgroups_v1 import V1_CONTROLLERS, CgroupV1Driver
from arl_tangram.managers.cpu.cgroups_v2 import V2_CONTROLLERS, CgroupV2Driver
from arl_tangram.managers.cpu.errors import CgroupUnavailableError


@dataclass(frozen=True)
class CgroupMount:
    mount_point: str
    root: str  # the path of the hierarchy that is mounted at mount_point
    fs_type: str  # "cgroup" (v1) or "cgroup2"
    controllers: frozenset[str]  # v1 controllers of this mount; empty for cgroup2


def parse_proc_cgroup(text: str) -> tuple[dict[str, str], str | None]:
    """``/proc/self/cgroup`` -> (v1 controller -> path, unified path or None)."""
    v1: dict[str, str] = {}
    unified: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            unified = path
            continue
        for c in controllers.split(","):
            v1[c] = path
    return v1, unified


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup and cgroup2 mounts listed in ``/proc/self/mountinfo``."""
    mounts: list[CgroupMount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3 or rfields[0] not in ("cgroup", "cgroup2"):
            continue
        opts = set(rfields[2].split(",")) | set(fields[5].split(",") if len(fields) > 5 else [])
        ctrls = frozenset(o for o in opts if o in V1_CONTROLLERS) if rfields[0] == "cgroup" else frozenset()
        mounts.append(CgroupMount(fields[4], fields[3], rfields[0], ctrls))
    return mounts


def _join(mount: CgroupMount, path: str) -> str:
    rel = os.path.relpath(path, mount.root) if mount.root != "/" else path.lstrip("/")
    if rel.startswith(".."):
        raise CgroupUnavailableError(f"own cgroup {path} lies outside the mount {mount.mount_point} (root {mount.root})")
    return os.path.normpath(os.path.join(mount.mount_point, rel))


def v1_parents(proc_cgroup: str, mountinfo: str) -> tuple[dict[str, str], list[str]]:
    """v1 controller -> parent directory (mount + own path), and the controllers missing."""
    own, _ = parse_proc_cgroup(proc_cgroup)
    mounts = [m for m in parse_mountinfo(mountinfo) if m.fs_type == "cgroup"]
    parents: dict[str, str] = {}
    for c in V1_CONTROLLERS:
        mount = next((m for m in mounts if c in m.controllers), None)
        if mount is not None and c in own:
            parents[c] = _join(mount, own[c])
    return parents, [c for c in V1_CONTROLLERS if c not in parents]


def v2_parent(proc_cgroup: str, mountinfo: str) -> str | None:
    """Directory of this process's unified group, when a cgroup2 mount exists."""
    _, unified = parse_proc_cgroup(proc_cgroup)
    mount = next((m for m in parse_mountinfo(mountinfo) if m.fs_type == "cgroup2"), None)
    if mount is None or unified is None:
        return None
    return _join(mount, unified)


def detect_driver(root_name: str, proc_root: str = "/proc/self", cgroup_parent: str | None = None) -> CgroupDriver:
    """Pick and build the driver for this host (see the module docstring for the rule).

    ``cgroup_parent`` forces v2 under an explicitly delegated directory.
    """
    if cgroup_parent is not None:
        return CgroupV2Driver(cgroup_parent, root_name)
    with open(os.path.join(proc_root, "cgroup"), encoding="utf-8") as f:
        proc_cgroup = f.read()
    with open(os.path.join(proc_root, "mountinfo"), encoding="utf-8") as f:
        mountinfo = f.read()
    parents, missing = v1_parents(proc_cgroup, mountinfo)
    if not missing:
        return CgroupV1Driver(parents, root_name)
    parent = v2_parent(proc_cgroup, mountinfo)
    if parent is not None:
        try:
            with open(os.path.join(parent, "cgroup.controllers"), encoding="ascii") as f:
                available = f.read().split()
        except OSError:
            available = []
        if all(c in available for c in V2_CONTROLLERS):
            return CgroupV2Driver(parent, root_name)
    raise CgroupUnavailableError(
        "no usable cgroups: v1 lacks " + (", ".join(missing) or "nothing")
        + "; no cgroup2 mount with " + ", ".join(V2_CONTROLLERS)
        + ". Pass unisolated=True for an explicitly unisolated development mode."
    )
