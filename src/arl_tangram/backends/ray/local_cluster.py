"""Shell: a multi-node Ray cluster on this one host (``ray.cluster_utils.Cluster``), for the
Ray backend's tests and bench: every "node" is a raylet of its own on loopback.

Owns: Ray's temp dir (a ``arl-tangram-<pid>-ray-*`` dir of its own, removed at close, short
enough for Ray's socket paths), the processes of every node (ended at close, the head
last), this process's connection to the cluster, and the environment it changed (restored).
Loopback only: Ray otherwise advertises the host's outward address.

A killed node's agent leaves its sandboxes to its CPU manager's keeper, which kills them and
removes their cgroups: the nodes are started with ``KEEP_CHILDREN_ENV`` so that Ray spares
the keeper. ``remove_cgroup_leftovers`` removes what an agent killed without its keeper left
(empty groups; a later sweep by another manager misses those of some hierarchies).
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from typing import Any

from arl_tangram.backends.ray.actor import KEEP_CHILDREN_ENV

NODE_MEMORY_BYTES = 150 << 20  # each node's object store (Ray's minimum for tests)
_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_DEDUP_LOGS": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    **KEEP_CHILDREN_ENV,  # the nodes' workers spare an agent's keeper (see backends.ray.actor)
}


class LocalRayCluster:
    """``start(head_resources)``, ``add_node(resources)``, ``remove_node(node)``, ``close()``.
    A node is returned as an opaque handle; ``node_id(node)`` is its Ray node id."""

    def __init__(self) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix=f"arl-tangram-{os.getpid()}-ray-")
        self._saved = {k: os.environ.get(k) for k in (*_ENV, "RAY_TMPDIR")}
        self._cluster: Any = None
        self._saved_enable: bool | None = None

    @property
    def address(self) -> str:
        return str(self._cluster.address)

    def start(
        self, head_resources: dict[str, float] | None = None, num_cpus: int = 1
    ) -> LocalRayCluster:
        """Start the head node (offering ``head_resources``) and connect this process."""
        os.environ.update(_ENV)
        os.environ["RAY_TMPDIR"] = self.temp_dir
        import ray
        from ray._private import ray_constants
        from ray.cluster_utils import Cluster

        # read at import; ray may have been imported before the environment was set
        self._saved_enable = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False
        try:
            self._cluster = Cluster(
                initialize_head=True,
                head_node_args={
                    "num_cpus": num_cpus, "resources": head_resources or {}, "include_dashboard": False,
                    "object_store_memory": NODE_MEMORY_BYTES,
                },
            )  # fmt: skip
            ray.init(address=self.address, log_to_driver=False)
        except BaseException:
            self.close()
            raise
        return self

    def add_node(self, resources: dict[str, float], num_cpus: int = 1) -> Any:
        """A new node offering ``resources``; returns once Ray lists it alive. Callable
        from any thread: off the main thread the node's processes are not tied to this
        process's exit (Ray's exit hooks set a SIGTERM handler, which only the main thread
        may); ``close`` ends them all the same."""
        cluster = self._cluster
        saved = cluster._shutdown_at_exit
        cluster._shutdown_at_exit = saved and threading.current_thread() is threading.main_thread()
        try:
            return cluster.add_node(
                num_cpus=num_cpus, resources=resources, object_store_memory=NODE_MEMORY_BYTES
            )
        finally:
            cluster._shutdown_at_exit = saved

    def remove_node(self, node: Any) -> None:
        """Kill the node's processes at once (SIGKILL), as a machine that dies."""
        self._cluster.remove_node(node, allow_graceful=False)

    @staticmethod
    def node_id(node: Any) -> str:
        return str(node.node_id)

    def close(self) -> None:
        """Disconnect, end every node, remove the temp dir, restore the environment. Idempotent."""
        import ray

        try:
            if ray.is_initialized():
                ray.shutdown()
            if self._cluster is not None:
                self._cluster.shutdown()
                self._cluster = None
        finally:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            if self._saved_enable is not None:
                from ray._private import ray_constants

                ray_constants.ENABLE_RAY_CLUSTER, self._saved_enable = self._saved_enable, None
            for key, value in self._saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def remove_cgroup_leftovers(roots: Iterable[str], timeout_s: float = 15.0) -> list[str]:
    """Remove the cgroup dirs of the manager roots ``roots`` (``arl-tangram-<pid>-<hex>``,
    agents on killed nodes) in every hierarchy, deepest first, retrying while the kernel
    still holds one busy; a group with a task in it is left alone. Returns what remains."""
    dirs = [d for top in cgroup_dirs(roots) for d, _, _ in os.walk(top)]
    deadline = time.monotonic() + timeout_s
    left = sorted(set(dirs), key=lambda d: -d.count("/"))
    while left and time.monotonic() < deadline:
        left = [d for d in left if not _rmdir_empty(d)]
        if left:
            time.sleep(0.2)
    return left


def cgroup_dirs(roots: Iterable[str]) -> list[str]:
    """The top cgroup dirs of the manager roots ``roots``, in every hierarchy."""
    found: list[str] = []
    for root in roots:
        if root.startswith("arl-tangram-"):
            for depth in range(1, 5):
                found += glob.glob("/sys/fs/cgroup/" + "*/" * depth + root)
    return sorted(found)


def _rmdir_empty(path: str) -> bool:
    """True once ``path`` is gone; False while it is busy or holds tasks."""
    try:
        with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as f:
            if f.read().strip():
                return False
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
            return False
        raise
    return True
