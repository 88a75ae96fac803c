"""Sandboxes on an image root (issue 19): overlay of read-only layers under a bounded private
upper, the image's user over the shifted uid range, its Env and WorkingDir, and host-side
file calls that resolve inside the sandbox's root. Each test names the mechanism it checks."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from arl_tangram.managers.cpu.config import SandboxSpec
from arl_tangram.managers.cpu.errors import InvalidRequestError
from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.managers.cpu.rootfs import STAGE_DIR, UID_SHIFT, ImageRoot
from tests.managers.cpu.conftest import SMALL, image_root
from tests.managers.cpu.image_tree import shift_tree


def _spec(root: ImageRoot, **overrides: int) -> SandboxSpec:
    base = {"mem_bytes": SMALL.mem_bytes, "pids_max": SMALL.pids_max, "workspace_bytes": SMALL.workspace_bytes,
            "tmp_bytes": SMALL.tmp_bytes, **overrides}  # fmt: skip
    return SandboxSpec(**base, root=root)


@pytest.fixture
def image_sb(manager: CpuManager, image_dir: Path) -> Iterator[str]:
    sid = manager.create_sandbox(_spec(image_root(image_dir)))
    yield sid
    manager.destroy_sandbox(sid)


def _host_ids(manager: CpuManager, sid: str) -> set[tuple[int, int]]:
    """(uid, gid) on the host of every task in the sandbox's cgroups."""
    ids = set()
    for pid in manager.driver.sandbox_pids(manager.get_sandbox(sid).group):
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                fields = dict(line.split(":", 1) for line in f)
        except FileNotFoundError:
            continue
        ids.add((int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])))
    return ids


def test_image_user_env_and_workdir(manager: CpuManager, image_sb: str) -> None:
    """Mechanism: the user namespace maps in-namespace 0 to host UID_SHIFT; Env and
    WorkingDir come from the image; root keeps only the default capabilities."""
    r = manager.exec(image_sb, "id -u; id -g; pwd; echo $IMAGE_VAR; cat /proc/self/uid_map; grep CapEff /proc/self/status")
    uid, gid, cwd, var, *rest = r.stdout_text.split("\n")
    assert (uid, gid, cwd, var) == ("0", "0", "/testbed", "from-image"), r
    assert rest[0].split() == ["0", str(UID_SHIFT), "65536"]
    assert not int(rest[1].split()[1], 16) & (1 << 21), "CAP_SYS_ADMIN must be dropped"
    assert manager.exec(image_sb, "sleep 300 &", background=True).ok
    assert _host_ids(manager, image_sb) == {(UID_SHIFT, UID_SHIFT)}  # init, bwrap and the job: never host root


def test_writes_go_to_the_private_upper(manager: CpuManager, image_dir: Path, image_sb: str) -> None:
    """Mechanism: the overlay's upper is per sandbox; the shared layer never changes. Root
    inside can write /usr (a 'pip install' into site-packages) and /testbed."""
    site = manager.exec(image_sb, ["python3", "-c", "import site; print(site.getsitepackages()[0])"]).stdout_text.strip()
    assert site.startswith("/usr/")
    r = manager.exec(image_sb, f"mkdir -p {site} && echo 'X = 42' > {site}/tangram_probe.py && echo t > /testbed/t && "
                               "python3 -c 'import tangram_probe; print(tangram_probe.X)'")  # fmt: skip
    assert r.stdout == b"42\n", r
    assert not (image_dir / site.lstrip("/") / "tangram_probe.py").exists() and not (image_dir / "testbed/t").exists()
    r = manager.exec(image_sb, "rm /etc/hostname && rm -r /usr/lib/python3.11/json && ls /etc/hostname /usr/lib/python3.11/json")
    assert r.exit_code != 0 and r.stderr.count(b"No such file") == 2, r  # whiteouts in the upper
    assert (image_dir / "etc/hostname").exists() and (image_dir / "usr/lib/python3.11/json").is_dir()
    sibling = manager.create_sandbox(_spec(image_root(image_dir)))
    try:
        assert manager.exec(sibling, "ls /testbed/t").exit_code != 0
    finally:
        manager.destroy_sandbox(sibling)


def test_layers_stack_lowest_first(manager: CpuManager, image_dir: Path, tmp_path: Path) -> None:
    """Mechanism: ``lower_dirs`` is lowest first; the top layer wins and its whiteout hides
    a lower file (overlay's lowerdir wants the reverse order: the helper reverses it)."""
    top = tmp_path / "top"
    (top / "etc").mkdir(parents=True)
    (top / "etc/hostname").write_text("top-layer\n")
    os.mknod(top / "etc/group", stat.S_IFCHR | 0o600, os.makedev(0, 0))  # an overlay whiteout
    shift_tree(top)
    sid = manager.create_sandbox(_spec(image_root(image_dir, lower_dirs=(image_dir, top))))
    try:
        r = manager.exec(sid, "cat /etc/hostname; ls /etc/group 2>&1; cat /etc/passwd | head -1")
        assert r.stdout_text.splitlines() == ["top-layer", "ls: cannot access '/etc/group': No such file or directory",
                                              "root:x:0:0:root:/root:/bin/bash"], r  # fmt: skip
    finally:
        manager.destroy_sandbox(sid)
        shutil.rmtree(top)


def test_writable_layer_is_bounded_and_charged_to_the_sandbox(manager: CpuManager, image_dir: Path) -> None:
    """Mechanism: the upper is a tmpfs of ``writable_bytes`` mounted after the helper joined
    the sandbox's cgroups, so it is full at its cap and its pages count as the env's memory."""
    sid = manager.create_sandbox(_spec(image_root(image_dir, writable_bytes=16 << 20)))
    try:
        group = manager.get_sandbox(sid).group
        before = manager.driver.sandbox_memory_bytes(group)
        assert manager.exec(sid, "head -c 12M /dev/zero > /big").ok
        assert manager.driver.sandbox_memory_bytes(group) - before >= 10 << 20
        r = manager.exec(sid, "head -c 8M /dev/zero > /big2")
        assert not r.ok and b"No space left" in r.stderr, r
        assert manager.exec(sid, "df -k / | tail -1").stdout.split()[1] == b"16384"
    finally:
        manager.destroy_sandbox(sid)


def test_mounts_stay_in_the_sandbox(manager: CpuManager, image_sb: str) -> None:
    """Mechanism: the tmpfs and overlay are mounted in a private mount namespace of the
    sandbox: the host's table never shows them, the sandbox's shows the overlay as /."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        host = [line.split() for line in f]
    assert not [m for m in host if m[4].startswith(STAGE_DIR) or m[m.index("-") + 2] == "arl-tangram-upper"]
    pid = manager.sandbox_info(image_sb).init_pid
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as f:
        mine = [line.split() for line in f]
    assert any(m[4] == "/" and "overlay" in m[m.index("-") + 1] for m in mine)


def test_host_file_calls_resolve_inside_the_root(manager: CpuManager, image_sb: str) -> None:
    """Mechanism: openat2(RESOLVE_IN_ROOT): a symlink to /etc/shadow reads the image's file or
    nothing, never the host's; writes through links land in the image; owners are shifted."""
    assert manager.exec(image_sb, "ln -s /etc/shadow /testbed/abs; ln -s ../../../../../etc/shadow /testbed/rel; "
                                  "ln -s /etc /testbed/etcdir").ok  # fmt: skip
    for link in ("/testbed/abs", "/testbed/rel", "abs"):
        with pytest.raises(FileNotFoundError):  # the image has no shadow; the host's is not read
            manager.read_file(image_sb, link)
    assert manager.exec(image_sb, "echo image-shadow > /etc/shadow").ok
    assert manager.read_file(image_sb, "/testbed/rel") == b"image-shadow\n"
    manager.write_file(image_sb, "/testbed/etcdir/new.conf", "k=v\n")
    manager.write_file(image_sb, "/usr/local/bin/tool", "#!/bin/sh\necho tool\n", mode=0o755)
    r = manager.exec(image_sb, "cat /etc/new.conf; stat -c '%u:%g' /etc/new.conf; tool")
    assert r.stdout_text.split() == ["k=v", "0:0", "tool"], r
    assert not os.path.exists("/etc/new.conf")
    with pytest.raises(InvalidRequestError, match="/proc"):
        manager.read_file(image_sb, "/proc/1/environ")


def test_uploads_downloads_and_sessions_on_an_image(manager: CpuManager, image_sb: str, tmp_path: Path) -> None:
    """Mechanism: transfers name absolute image paths and go through the in-root resolver; a
    session starts in the WorkingDir with the image's Env."""
    src = tmp_path / "pkg"
    (src / "sub").mkdir(parents=True)
    (src / "sub/mod.py").write_text("V = 1\n")
    assert manager.upload(image_sb, str(src), "/opt/pkg") == 1
    assert manager.exec(image_sb, "ln -s /etc /opt/pkg/etc-link && cat /opt/pkg/sub/mod.py").stdout == b"V = 1\n"
    out = tmp_path / "out"
    assert manager.download(image_sb, "/opt/pkg", str(out)) == 1  # the link is not followed out
    assert (out / "sub/mod.py").read_text() == "V = 1\n" and not (out / "etc-link").exists()
    session = manager.open_session(image_sb)
    try:
        r = manager.run_in_session(session, "pwd; echo $IMAGE_VAR; id -u")
        assert r.stdout_text.split() == ["/testbed", "from-image", "0"], r
    finally:
        manager.close_session(session)


def test_missing_working_dir_is_made(manager: CpuManager, image_dir: Path) -> None:
    """Mechanism: a WorkingDir the image lacks is created in the sandbox's upper."""
    sid = manager.create_sandbox(_spec(image_root(image_dir, working_dir="/srv/app")))
    try:
        assert manager.exec(sid, "pwd").stdout == b"/srv/app\n"
        assert not (image_dir / "srv").exists()
    finally:
        manager.destroy_sandbox(sid)


def test_non_root_image_user(manager: CpuManager, image_dir: Path) -> None:
    """Mechanism: an image ``User`` of uid 1000 runs as 1000 inside (host 101000): it cannot
    write root's files of the image, and host-side writes get its shifted owner."""
    sid = manager.create_sandbox(_spec(image_root(image_dir, uid=1000, gid=1000, working_dir="/workspace")))
    try:
        r = manager.exec(sid, "id -u; echo x > /etc/evil")
        assert r.stdout == b"1000\n" and b"Permission denied" in r.stderr, r
        manager.write_file(sid, "mine.txt", "m")
        assert manager.exec(sid, "stat -c %u mine.txt").stdout == b"1000\n"
    finally:
        manager.destroy_sandbox(sid)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"lower_dirs": ()}, "root.lower_dirs"),
        ({"lower_dirs": (Path("relative"),)}, "root.lower_dirs"),
        ({"working_dir": "testbed"}, "root.working_dir"),
        ({"uid": 65536}, "root.uid"),
        ({"gid": -1}, "root.gid"),
        ({"writable_bytes": 4096}, "root.writable_bytes"),
        ({"env": (("A=B", "c"),)}, "root.env"),
    ],
)
def test_bad_image_roots_are_refused(image_dir: Path, overrides: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        image_root(image_dir, **overrides)
    assert info.value.field == field


def test_spec_root_must_be_an_image_root() -> None:
    with pytest.raises(InvalidRequestError, match="spec.root"):
        SandboxSpec(root="/some/dir")  # type: ignore[arg-type]
