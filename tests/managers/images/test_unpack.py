"""The hostile-layer-safe unpacker, on real tars: every case is refused (naming the layer)
or contained inside the layer directory; nothing is written outside it."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from arl_tangram.managers.images.errors import LayerRefusedError
from arl_tangram.managers.images.model import UID_SHIFT
from arl_tangram.managers.images.streams import unpack_blob
from tests.managers.images.builders import LayerTar, compress, sha

LABEL = "sha256:feedface"


def unpack(tmp_path: Path, blob: bytes, **kw) -> Path:  # type: ignore[no-untyped-def]
    dest = tmp_path / "layer"
    dest.mkdir()
    unpack_blob(io.BytesIO(blob), dest, LABEL, **kw)
    return dest


def refused(tmp_path: Path, blob: bytes, match: str, **kw) -> LayerRefusedError:  # type: ignore[no-untyped-def]
    with pytest.raises(LayerRefusedError, match=match) as info:
        unpack(tmp_path, blob, **kw)
    assert LABEL in str(info.value)
    return info.value


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory beside the layer that no layer may touch."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "passwd").write_text("host secret")
    return out


def assert_untouched(outside: Path) -> None:
    assert sorted(os.listdir(outside)) == ["passwd"]
    assert (outside / "passwd").read_text() == "host secret"


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_round_trip_keeps_content_and_shifts_ids(tmp_path: Path, compression: str) -> None:
    tar = LayerTar().dir("etc").file("etc/motd", b"hello", mode=0o640, uid=1000, gid=1001).symlink("link", "etc/motd").build()
    blob = compress(tar, compression)
    dest = unpack(tmp_path, blob, blob_digest=sha(blob), diff_id=sha(tar), declared_bytes=len(blob))
    st = os.lstat(dest / "etc" / "motd")
    assert (dest / "etc" / "motd").read_bytes() == b"hello"
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (UID_SHIFT + 1000, UID_SHIFT + 1001, 0o640)
    assert os.readlink(dest / "link") == "etc/motd"
    assert os.lstat(dest / "link").st_uid == UID_SHIFT
    assert os.stat(dest).st_uid == UID_SHIFT


def test_dotdot_path_is_refused(tmp_path: Path, outside: Path) -> None:
    refused(tmp_path, LayerTar().file("../outside/passwd", b"pwned").build(), "escapes the layer")
    assert_untouched(outside)


def test_absolute_path_is_contained(tmp_path: Path, outside: Path) -> None:
    dest = unpack(tmp_path, LayerTar().file(str(outside / "passwd"), b"pwned").build())
    assert_untouched(outside)
    assert (dest / str(outside).lstrip("/") / "passwd").read_bytes() == b"pwned"


def test_absolute_symlink_then_a_file_through_it_is_refused(tmp_path: Path, outside: Path) -> None:
    tar = LayerTar().symlink("etc", str(outside)).file("etc/passwd", b"pwned").build()
    refused(tmp_path, tar, "symlink or non-directory")
    assert_untouched(outside)


def test_relative_symlink_out_then_a_file_through_it_is_refused(tmp_path: Path, outside: Path) -> None:
    tar = LayerTar().symlink("up", "../outside").file("up/new", b"pwned").build()
    refused(tmp_path, tar, "symlink or non-directory")
    assert_untouched(outside)


def test_symlink_swapped_in_mid_archive_is_refused(tmp_path: Path, outside: Path) -> None:
    tar = (LayerTar().dir("d").file("d/a", b"ok").symlink("d", str(outside)).file("d/passwd", b"pwned").build())
    refused(tmp_path, tar, "symlink or non-directory")
    assert_untouched(outside)


def test_file_over_an_existing_symlink_replaces_the_link(tmp_path: Path, outside: Path) -> None:
    dest = unpack(tmp_path, LayerTar().symlink("p", str(outside / "passwd")).file("p", b"mine").build())
    assert_untouched(outside)
    assert not os.path.islink(dest / "p") and (dest / "p").read_bytes() == b"mine"


@pytest.mark.parametrize("target", ["/etc/passwd", "../outside/passwd", "missing/file"])
def test_hardlink_to_a_file_outside_the_layer_is_refused(tmp_path: Path, outside: Path, target: str) -> None:
    refused(tmp_path, LayerTar().hardlink("h", target).build(), "escapes the layer|not in this layer")
    assert_untouched(outside)


def test_hardlink_inside_the_layer_then_overwrite_does_not_write_through(tmp_path: Path) -> None:
    dest = unpack(tmp_path, LayerTar().file("a", b"one").hardlink("b", "a").file("b", b"two").build())
    assert (dest / "a").read_bytes() == b"one" and (dest / "b").read_bytes() == b"two"


def test_hardlink_through_a_symlink_is_refused(tmp_path: Path, outside: Path) -> None:
    tar = LayerTar().symlink("s", str(outside)).hardlink("h", "s/passwd").build()
    refused(tmp_path, tar, "symlink or non-directory")


@pytest.mark.parametrize("kind,major", [(tarfile.CHRTYPE, 1), (tarfile.BLKTYPE, 8), (tarfile.CHRTYPE, 0)])
def test_device_nodes_from_the_tar_are_not_created(tmp_path: Path, kind: bytes, major: int) -> None:
    dest = unpack(tmp_path, LayerTar().device("dev/node", kind, major, 0).file("ok", b"1").build())
    assert not os.path.lexists(dest / "dev" / "node")
    assert (dest / "ok").exists()


def test_setuid_binary_keeps_its_bits_but_only_for_a_shifted_owner(tmp_path: Path) -> None:
    dest = unpack(tmp_path, LayerTar().file("bin/su", b"\x7fELF", mode=0o6755).build())
    st = os.lstat(dest / "bin" / "su")
    assert st.st_mode & (stat.S_ISUID | stat.S_ISGID) == stat.S_ISUID | stat.S_ISGID
    assert (st.st_uid, st.st_gid) == (UID_SHIFT, UID_SHIFT)


def test_ids_outside_the_range_are_refused(tmp_path: Path) -> None:
    refused(tmp_path, LayerTar().file("f", b"x", uid=70000).build(), "ids must be < 65536")


def test_xattrs_are_filtered(tmp_path: Path) -> None:
    pax = {"SCHILY.xattr.user.keep": "yes", "SCHILY.xattr.trusted.overlay.opaque": "y",
           "SCHILY.xattr.trusted.overlay.redirect": "/etc", "SCHILY.xattr.security.capability": "\x01\x00\x00\x02"}
    dest = unpack(tmp_path, LayerTar().file("f", b"x", pax=pax).build())
    names = set(os.listxattr(dest / "f", follow_symlinks=False))
    assert "trusted.overlay.opaque" not in names and "trusted.overlay.redirect" not in names
    assert "security.capability" not in names
    if "user.keep" in names:  # the store's filesystem may lack user xattrs
        assert os.getxattr(dest / "f", "user.keep") == b"yes"


def test_oci_whiteouts_become_overlay_whiteouts(tmp_path: Path) -> None:
    tar = LayerTar().dir("etc").file("etc/.wh.gone").dir("opq").file("opq/.wh..wh..opq").file("opq/kept").build()
    dest = unpack(tmp_path, tar)
    st = os.lstat(dest / "etc" / "gone")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0)
    assert not os.path.lexists(dest / "etc" / ".wh.gone")
    assert os.getxattr(dest / "opq", "trusted.overlay.opaque") == b"y"
    assert os.listdir(dest / "opq") == ["kept"]


def test_blob_digest_mismatch_is_refused(tmp_path: Path) -> None:
    blob = compress(LayerTar().file("f").build(), "gzip")
    refused(tmp_path, blob, "digest mismatch", blob_digest=sha(b"something else"))


def test_diff_id_mismatch_is_refused(tmp_path: Path) -> None:
    blob = compress(LayerTar().file("f").build(), "gzip")
    refused(tmp_path, blob, "diff_id mismatch", diff_id=sha(b"other"))


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_truncated_blob_is_refused(tmp_path: Path, compression: str) -> None:
    blob = compress(LayerTar().file("big", os.urandom(200_000)).build(), compression)
    cut = blob[: len(blob) // 2]
    refused(tmp_path, cut, "truncated", declared_bytes=len(blob))


def test_layer_larger_than_declared_is_refused_while_reading(tmp_path: Path) -> None:
    blob = compress(LayerTar().file("big", os.urandom(8 << 20)).build(), "gzip")
    source = io.BytesIO(blob)
    dest = tmp_path / "layer"
    dest.mkdir()
    with pytest.raises(LayerRefusedError, match="larger than its declared size") as info:
        unpack_blob(source, dest, LABEL, declared_bytes=300_000)
    assert LABEL in str(info.value)
    assert source.tell() <= 300_000 + (2 << 20)  # stopped at the declared size, not at 8 MiB


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_decompression_bomb_stops_at_the_cap(tmp_path: Path, compression: str) -> None:
    cap = 4 << 20
    blob = compress(LayerTar().file("zeros", bytes(64 << 20)).build(), compression)
    seen = [0]

    def charge(n: int) -> None:
        seen[0] += n
        if seen[0] > cap:
            raise LayerRefusedError("layer", f"{LABEL}: unpacks past the per-layer cap of {cap} bytes")

    refused(tmp_path, blob, "per-layer cap", charge_unpacked=charge)
    assert seen[0] <= cap + (2 << 20)  # stopped within a chunk or two, not after 64 MiB


def test_sparse_member_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "holes", "wb") as f:
        f.truncate(1 << 30)  # 1 GiB of holes: a few hundred bytes as a sparse tar member
        f.write(b"end")
    tar = subprocess.run(["tar", "-C", str(src), "--sparse", "--format=gnu", "-cf", "-", "holes"],
                         capture_output=True, check=True).stdout
    assert len(tar) < 1 << 20
    refused(tmp_path, tar, "sparse file")


def test_host_tree_unpacks_like_gnu_tar_but_shifted(tmp_path: Path) -> None:
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", "/usr/lib/python3.11/json", str(src)], check=True)
    os.symlink("decoder.py", src / "alias.py")
    os.link(src / "encoder.py", src / "encoder-hard.py")
    os.chmod(src / "tool.py", 0o4750)
    tar = subprocess.run(["tar", "-C", str(src), "--numeric-owner", "-cf", "-", "."], capture_output=True, check=True).stdout
    ours = unpack(tmp_path, tar)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    subprocess.run(["tar", "-C", str(theirs), "--numeric-owner", "-xpf", "-"], input=tar, check=True)

    def tree(root: Path) -> dict[str, tuple]:  # type: ignore[type-arg]
        out = {}
        for dirpath, dirs, files in os.walk(root):
            for name in dirs + files:
                p = Path(dirpath) / name
                st = os.lstat(p)
                body = os.readlink(p) if stat.S_ISLNK(st.st_mode) else (p.read_bytes() if stat.S_ISREG(st.st_mode) else b"")
                out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode) if not
                                                 stat.S_ISLNK(st.st_mode) else 0, body, st.st_uid, st.st_nlink)
        return out

    mine, gnu = tree(ours), tree(theirs)
    assert sorted(mine) == sorted(gnu)
    for name, (kind, mode, body, uid, nlink) in gnu.items():
        assert mine[name] == (kind, mode, body, uid + UID_SHIFT, nlink), name
