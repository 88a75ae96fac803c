"""Isolation from the host and between sandboxes, checked from inside real sandboxes on the
host root, on an image root, and on a forked env's root (a real snapshot's layer over the
image, fresh upper: what ``Env.fork`` gives a child)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from arl_tangram.managers.cpu.manager import CpuManager
from tests.managers.cpu.conftest import SpecMaker
from tests.snapshots.node_kit import open_node


@pytest.fixture(scope="module")
def fork_layer(manager: CpuManager, image_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The layer a parent's snapshot made (files written, one deleted: a whiteout)."""
    node = open_node(manager, image_dir, tmp_path_factory.mktemp("fork-store"))
    parent = node.create()
    node.sh(parent, "echo parent > /testbed/p && echo w > /workspace/w && rm -f /etc/hostname")
    snap = node.snapshot(parent)
    child = node.create(snap)  # the suite's roots really are a fork's: the parent's files, its deletion
    assert node.sh(child, "cat /testbed/p /workspace/w; test -e /etc/hostname || echo gone") == "parent\nw\ngone\n"
    node.close()
    yield node.snaps.store.layer_dir(snap.snapshot_id)


@pytest.fixture(params=["host", "image", "fork"])
def spec(request: pytest.FixtureRequest, image_dir: Path, fork_layer: Path) -> SpecMaker:
    """The escape suite on the host root, an image root and a forked env's root."""
    if request.param == "fork":
        return SpecMaker(image_dir, (fork_layer,))
    return SpecMaker(image_dir if request.param == "image" else None)


@pytest.fixture
def host_server() -> Iterator[int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    yield srv.getsockname()[1]
    srv.close()


def test_no_network_to_host_loopback(manager: CpuManager, any_sandbox: str, host_server: int) -> None:
    code = f"import socket; socket.create_connection(('127.0.0.1', {host_server}), timeout=2)"
    r = manager.exec(any_sandbox, ["python3", "-c", code])
    assert not r.ok and b"Connection refused" in r.stderr
    r = manager.exec(any_sandbox, ["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)"])
    assert not r.ok and b"unreachable" in r.stderr.lower()
    assert manager.exec(any_sandbox, "ls /sys/class/net 2>/dev/null || cat /proc/net/dev").stdout.count(b"lo") >= 1


def test_cannot_write_outside_workspace(manager: CpuManager, any_sandbox: str, spec: SpecMaker) -> None:
    """Host root: read-only outside the workspace and /tmp. Image root: writes land in the
    sandbox's own upper only; neither the host, the shared layer nor a sibling sees them."""
    for target in ("/etc/evil", "/usr/evil", "/evil"):
        r = manager.exec(any_sandbox, f"echo x > {target}")
        if spec.image is None:
            assert not r.ok and b"Read-only file system" in r.stderr, target
        else:
            assert r.ok, (target, r)
            assert not os.path.exists(target) and not os.path.exists(f"{spec.image}{target}")
    assert manager.exec(any_sandbox, "echo ok > /tmp/t && echo ok > /workspace/t").ok
    if spec.image is not None:
        sibling = manager.create_sandbox(spec())
        try:
            assert manager.exec(sibling, "cat /etc/evil").exit_code != 0
        finally:
            manager.destroy_sandbox(sibling)


def test_other_workspaces_and_host_secrets_invisible(manager: CpuManager, any_sandbox: str, spec: SpecMaker) -> None:
    other = manager.create_sandbox(spec())
    try:
        manager.write_file(other, "secret.txt", "other's data")
        r = manager.exec(any_sandbox, f"ls {spec.cwd}; ls /root /home 2>&1; cat /proc/1/cmdline | tr '\\0' ' '")
        assert b"secret.txt" not in r.stdout
        assert b"No such file or directory" in r.stdout
        init_pid = manager.sandbox_info(other).init_pid
        r = manager.exec(any_sandbox, f"cat /proc/{init_pid}/root{spec.cwd}/secret.txt")
        assert not r.ok
        assert manager.exec(any_sandbox, "cat /etc/shadow").exit_code != 0
    finally:
        manager.destroy_sandbox(other)


def test_cannot_see_or_kill_host_processes(manager: CpuManager, any_sandbox: str, spec: SpecMaker) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        r = manager.exec(any_sandbox, f"kill -9 {victim.pid}; kill -9 1; ps -e 2>/dev/null | wc -l; ls /proc | grep -c '^[0-9]'")
        assert victim.poll() is None
        assert int(r.stdout.split()[-1]) < 10  # only the sandbox's own few processes are visible
        assert manager.exec(any_sandbox, "id -u").stdout == f"{spec.uid}\n".encode()
        assert os.path.exists(f"/proc/{victim.pid}")
    finally:
        victim.kill()
        victim.wait()


def test_the_host_root_names_only_the_sandbox_user(manager: CpuManager, any_sandbox: str, spec: SpecMaker) -> None:
    """On the host root, a generated passwd/group pair (read-only) hides the host's accounts;
    an image root keeps the image's own."""
    r = manager.exec(any_sandbox, "whoami; id -gn; cat /etc/passwd; echo x >> /etc/passwd || echo refused")
    host_users = {line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines() if line}
    seen = {line.split(":")[0] for line in r.stdout.decode().splitlines()[2:] if ":" in line}
    if spec.image is None:
        assert r.stdout.endswith(b"refused\n")  # read-only: the sandbox cannot add accounts
        assert r.stdout.startswith(b"sandbox\nsandbox\n")
        assert seen == {"root", "sandbox", "nobody"}
    else:
        image_users = {line.split(":")[0] for line in (spec.image / "etc/passwd").read_text().splitlines() if line}
        assert seen == image_users and seen != host_users
