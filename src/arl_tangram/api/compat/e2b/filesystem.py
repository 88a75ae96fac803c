"""Shell: envd's ``filesystem.Filesystem`` service: ``Stat``, ``ListDir``, ``MakeDir``,
``Move``, ``Remove``, each one small single-core action in the sandbox (GNU ``find``,
``mkdir``, ``mv``, ``rm`` of the sandbox's own root, so an image's symlinks resolve inside
it and its user's rights apply). A relative path is relative to the sandbox's working
directory (the image's ``WorkingDir``, else /workspace). Outcomes the SDK reads:
``not_found`` (``exists`` -> False, ``NotFoundException``), ``already_exists``
(``make_dir`` -> False), ``invalid_argument`` (listing a file). Watching (``WatchDir``
and the watcher calls) is not served: ``unimplemented``.
"""

from __future__ import annotations

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
FIELDS = 10  # of one entry in FORMAT
#: find's record of one entry, NUL-separated (a name may hold tabs or newlines): type
#: followed, own type, size, mode, permissions, owner, group, mtime, target, path
FORMAT = r"%Y\0%y\0%s\0%m\0%M\0%u\0%g\0%T@\0%l\0%p\0"
ABSOLUTE = 'p=$1; case $p in /*) ;; *) p=$PWD/$p ;; esac; '
#: exit 2: no such path; 3: not a directory; 4: already exists
SCRIPTS = {
    "stat": ABSOLUTE + '[ -e "$p" ] || [ -L "$p" ] || exit 2; find "$p" -maxdepth 0 -printf "$2"',
    "list": ABSOLUTE + '[ -e "$p" ] || exit 2; [ -d "$p" ] || exit 3; find "$p" -mindepth 1 -maxdepth "$3" -printf "$2"',
    "mkdir": ABSOLUTE + '[ -e "$p" ] && exit 4; mkdir -p -- "$p" && find "$p" -maxdepth 0 -printf "$2"',
    "move": ABSOLUTE + 'q=$3; case $q in /*) ;; *) q=$PWD/$q ;; esac; [ -e "$p" ] || [ -L "$p" ] || exit 2; '
    'mv -f -- "$p" "$q" && find "$q" -maxdepth 0 -printf "$2"',
    "remove": ABSOLUTE + '[ -e "$p" ] || [ -L "$p" ] || exit 2; rm -rf -- "$p"',
}
TYPES = {"f": pb.FileType.FILE, "d": pb.FileType.DIRECTORY, "l": pb.FileType.SYMLINK}


async def _run(e2b: E2bState, sb: E2bSandbox, op: str, path: str, extra: str = "") -> str:
    if not path:
        raise ConnectError("invalid_argument", "path: must be a non-empty path")
    argv = ("bash", "-c", SCRIPTS[op], "e2b-fs", path, FORMAT, extra)
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
        seconds = float(mtime or 0)
        found.append(
            pb.EntryInfo(
                name=path.rstrip("/").rsplit("/", 1)[-1] or "/", type=TYPES.get(kind, pb.FileType.UNSPECIFIED), path=path,
                size=int(size or 0), mode=int(mode or "0", 8), permissions=perms, owner=owner, group=group,
                modified_time=Timestamp(seconds=int(seconds), nanos=int(seconds % 1 * 1e9)),
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
