"""Shell: envd's ``filesystem.Filesystem`` service: ``Stat``, ``ListDir``, ``MakeDir``,
``Move``, ``Remove``, each one small single-core action in the sandbox (bash with GNU
``stat``, ``readlink``, ``mkdir``, ``mv``, ``rm`` of the sandbox's own root, so an image's symlinks resolve inside
it and its user's rights apply). A relative path is relative to the sandbox's working
directory (the image's ``WorkingDir``, else /workspace). Outcomes the SDK reads:
``not_found`` (``exists`` -> False, ``NotFoundException``), ``already_exists``
(``make_dir`` -> False), ``invalid_argument`` (listing a file). Watching (``WatchDir``
and the watcher calls) is not served: ``unimplemented``.
"""

from __future__ import annotations

import posixpath
from typing import Any

from fastapi import APIRouter, Request, Response
from protobuf.wkt import Timestamp

from arl_tangram.api.compat.e2b.connect import ConnectError
from arl_tangram.api.compat.e2b.envd import unary
from arl_tangram.api.compat.e2b.sandboxes import E2bSandbox, E2bState
from arl_tangram.api.compat.pool import run_env_action
from arl_tangram.runtime.actions import ExecPayload

from e2b.envd.filesystem import filesystem_pb as pb  # isort: skip  # the message classes the SDK ships

router = APIRouter(tags=["e2b-envd"], include_in_schema=False)
FS_TIMEOUT_S = 30.0
FIELDS = 10  # of one entry's record
#: one entry's record, NUL-separated (a name may hold tabs or newlines): type followed, own
#: type (l: a link), size, octal mode, permissions, owner, group, mtime, link target, path;
#: bash and GNU stat only (coreutils: in every image that can run E2B's bash commands)
ONE = (
    'one() { local own=f t=""; if [ -L "$1" ]; then own=l; t=$(readlink -- "$1"); fi; '
    'stat -L --printf "%F\\0" -- "$1" 2>/dev/null || printf "symbolic link\\0"; printf "%s\\0" "$own"; '
    'stat -L --printf "%s\\0%a\\0%A\\0%U\\0%G\\0%Y\\0" -- "$1" 2>/dev/null '
    '|| stat --printf "%s\\0%a\\0%A\\0%U\\0%G\\0%Y\\0" -- "$1"; printf "%s\\0%s\\0" "$t" "$1"; }; '
    'walk() { local e; for e in "$1"/*; do one "$e"; '
    'if [ "$2" -gt 1 ] && [ -d "$e" ] && [ ! -L "$e" ]; then walk "$e" $(($2 - 1)); fi; done; }; '
    'shopt -s nullglob dotglob; '
)
ABSOLUTE = 'p=$1; case $p in /*) ;; *) p=$PWD/$p ;; esac; '
#: exit 2: no such path; 3: not a directory; 4: already exists
SCRIPTS = {
    "stat": ONE + ABSOLUTE + '[ -e "$p" ] || [ -L "$p" ] || exit 2; one "$p"',
    "list": ONE + ABSOLUTE + '[ -e "$p" ] || exit 2; [ -d "$p" ] || exit 3; walk "$p" "$2"',
    "mkdir": ONE + ABSOLUTE + '[ -e "$p" ] && exit 4; mkdir -p -- "$p" && one "$p"',
    "move": ONE + ABSOLUTE + 'q=$2; case $q in /*) ;; *) q=$PWD/$q ;; esac; [ -e "$p" ] || [ -L "$p" ] || exit 2; '
    'mv -f -- "$p" "$q" && one "$q"',
    "remove": ONE + ABSOLUTE + '[ -e "$p" ] || [ -L "$p" ] || exit 2; rm -rf -- "$p"',
}
TYPES = {"regular file": pb.FileType.FILE, "regular empty file": pb.FileType.FILE, "directory": pb.FileType.DIRECTORY, "symbolic link": pb.FileType.SYMLINK}


async def _run(e2b: E2bState, sb: E2bSandbox, op: str, path: str, extra: str = "") -> str:
    if not path:
        raise ConnectError("invalid_argument", "path: must be a non-empty path")
    argv = ("bash", "-c", SCRIPTS[op], "e2b-fs", path, extra)
    result = await run_env_action(e2b.api, sb.tenant, sb.internal, "e2b:fs", ExecPayload(argv, None, (), None, FS_TIMEOUT_S))
    if result.outcome == "succeeded":
        return result.stdout
    if result.exit_code == 2:
        raise ConnectError("not_found", f"path {path!r} does not exist")
    if result.exit_code == 3:
        raise ConnectError("invalid_argument", f"path {path!r} is not a directory")
    if result.exit_code == 4:
        raise ConnectError("already_exists", f"path {path!r} already exists")
    detail = (result.stderr or result.cause or result.outcome).strip()[:500]
    code = "permission_denied" if "ermission denied" in detail else "internal"
    raise ConnectError(code, f"{op} {path!r}: {detail}")


def entries(out: str) -> list[Any]:
    """The ``EntryInfo`` s of find's NUL-separated records."""
    parts = out.split("\0")
    found = []
    for i in range(0, len(parts) - FIELDS + 1, FIELDS):
        kind, own, size, mode, perms, owner, group, mtime, target, path = parts[i : i + FIELDS]
        path = posixpath.normpath(path)
        found.append(
            pb.EntryInfo(
                name=posixpath.basename(path) or "/", type=TYPES.get(kind, pb.FileType.UNSPECIFIED), path=path,
                size=int(size or 0), mode=int(mode or "0", 8), permissions=perms, owner=owner, group=group,
                modified_time=Timestamp(seconds=int(mtime or 0)),
                symlink_target=target if own == "l" else None, is_symlink=own == "l",
            )
        )  # fmt: skip
    return found


def _one(out: str, path: str) -> Any:
    found = entries(out)
    if not found:
        raise ConnectError("not_found", f"path {path!r} does not exist")
    return found[0]


@router.post("/filesystem.Filesystem/Stat")
async def stat(request: Request) -> Response:
    async def work(e2b: E2bState, sb: E2bSandbox, m: Any) -> Any:
        return pb.StatResponse(entry=_one(await _run(e2b, sb, "stat", m.path), m.path))

    return await unary(request, pb.StatRequest, work)


@router.post("/filesystem.Filesystem/ListDir")
async def list_dir(request: Request) -> Response:
    async def work(e2b: E2bState, sb: E2bSandbox, m: Any) -> Any:
        depth = m.depth or 1
        found = entries(await _run(e2b, sb, "list", m.path, str(depth)))
        return pb.ListDirResponse(entries=sorted(found, key=lambda e: e.path))

    return await unary(request, pb.ListDirRequest, work)


@router.post("/filesystem.Filesystem/MakeDir")
async def make_dir(request: Request) -> Response:
    async def work(e2b: E2bState, sb: E2bSandbox, m: Any) -> Any:
        return pb.MakeDirResponse(entry=_one(await _run(e2b, sb, "mkdir", m.path), m.path))

    return await unary(request, pb.MakeDirRequest, work)


@router.post("/filesystem.Filesystem/Move")
async def move(request: Request) -> Response:
    async def work(e2b: E2bState, sb: E2bSandbox, m: Any) -> Any:
        if not m.destination:
            raise ConnectError("invalid_argument", "destination: must be a non-empty path")
        return pb.MoveResponse(entry=_one(await _run(e2b, sb, "move", m.source, m.destination), m.destination))

    return await unary(request, pb.MoveRequest, work)


@router.post("/filesystem.Filesystem/Remove")
async def remove(request: Request) -> Response:
    async def work(e2b: E2bState, sb: E2bSandbox, m: Any) -> Any:
        await _run(e2b, sb, "remove", m.path)
        return pb.RemoveResponse()

    return await unary(request, pb.RemoveRequest, work)


async def _unwatched(e2b: E2bState, sb: E2bSandbox, m: Any) -> Any:
    raise ConnectError("unimplemented", "watching directories is not served by ARL-Tangram's envd face")


def _unwatched_route(request_cls: type) -> Any:
    async def route(request: Request) -> Response:
        return await unary(request, request_cls, _unwatched)

    return route


for _name, _cls in (("CreateWatcher", pb.CreateWatcherRequest), ("GetWatcherEvents", pb.GetWatcherEventsRequest), ("RemoveWatcher", pb.RemoveWatcherRequest)):
    router.add_api_route(f"/filesystem.Filesystem/{_name}", _unwatched_route(_cls), methods=["POST"])
