"""Shell: ``arl-tangram image pull|import|list|rm|prefetch``.

Two places an image lives, two modes:

- ``--config FILE`` (the node's configuration, its ``[images]`` table): this node's store,
  opened in this process; the operator's tool to seed a node before (or between) ``serve``
  runs. ``pull`` and ``import`` show a progress bar of each layer's fetch and unpack on a
  TTY, plain progress lines otherwise. One process at a time may open a store: do not point
  it at a store a running server uses (ask the server instead).
- otherwise the server at ``--url`` (``$ARL_TANGRAM_URL``): ``list``, ``rm``, ``import``
  of a path on the server (when its operator allows it) and ``prefetch`` (the scheduler
  pulls onto its nodes, one pull per layer, bounded per node). ``pull`` needs ``--config``:
  a server pulls through ``prefetch``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

MIB = 1 << 20
ACTIONS = ("pull", "import", "list", "rm", "prefetch")
BAR_CHARS = 24


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``image`` subcommand under ``sub`` (``common``: --url, --token, --json)."""
    image = sub.add_parser("image", parents=[common], help="pull, import, list, remove or prefetch images")
    image.add_argument("action", choices=ACTIONS)
    image.add_argument("targets", nargs="*", help="references (pull, rm, prefetch) or a path (import)")
    image.add_argument("--config", default=None, help="the node's configuration: act on its [images] store here")
    image.add_argument("--reference", default=None, help="import: the reference to give the imported image")
    image.add_argument("--nodes", default="", help="prefetch: comma-separated node ids (default: every node)")


class LayerProgress:
    """Renders ``PullProgress`` reports: one redrawn bar on a TTY (at most 10 redraws a
    second), one line per layer phase change otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.phases: dict[str, str] = {}
        self.drawn_at = 0.0

    def __call__(self, p: Any) -> None:
        layer = p.layer_digest.removeprefix("sha256:")[:12]
        changed = self.phases.get(p.layer_digest) != p.phase
        self.phases[p.layer_digest] = p.phase
        if not self.tty:
            if changed:
                total = f" of {p.total_bytes / MIB:.1f} MiB" if p.total_bytes else ""
                print(f"{p.reference}: layer {layer}: {p.phase}{total}", file=self.out, flush=True)
            return
        now = time.monotonic()
        if not changed and now - self.drawn_at < 0.1:
            return
        self.drawn_at = now
        frac = min(p.done_bytes / p.total_bytes, 1.0) if p.total_bytes else (1.0 if p.phase in ("done", "cached") else 0.0)
        bar = "#" * int(frac * BAR_CHARS)
        self.out.write(f"\r{layer} {p.phase:<6} [{bar:<{BAR_CHARS}}] {p.done_bytes / MIB:8.1f} MiB\x1b[K")
        if p.phase in ("done", "cached"):
            self.out.write("\n")
        self.out.flush()


def _record_view(record: Any) -> dict[str, Any]:
    return {
        "image_id": record.image_id, "references": list(record.references), "size_bytes": int(record.size_bytes),
        "layers": [{"digest": layer.digest, "size_bytes": int(layer.unpacked_bytes)} for layer in record.layers],
    }  # fmt: skip


def _print_images(images: list[dict[str, Any]]) -> None:
    for i in images:
        nodes = f"  on {', '.join(i['nodes'])}" if i.get("nodes") else ""
        refs = ", ".join(i["references"]) or "(no reference)"
        print(f"{i['image_id'][:19]}  {i['size_bytes'] / MIB:9.1f} MiB  {len(i['layers'])} layer(s)  {refs}{nodes}")


def run_local(args: argparse.Namespace) -> int:
    """The action on the store of ``args.config``'s ``[images]`` table, in this process."""
    from arl_tangram.runtime.config import load_config
    from arl_tangram.runtime.config_images import make_image_store

    config = load_config(args.config)
    if config.images is None:
        raise SystemExit(f"arl-tangram: image: {args.config} has no [images] table (store_path)")
    from arl_tangram.managers.images import ImageError

    store = make_image_store(config.images)
    try:
        return _local_action(store, args)
    except ImageError as exc:
        raise SystemExit(f"arl-tangram: image {args.action}: {exc}") from None
    finally:
        store.close()


def _local_action(store: Any, args: argparse.Namespace) -> int:
    progress = LayerProgress(sys.stderr)
    if args.action == "pull":
        records = [store.pull(ref, progress=progress) for ref in _need(args, "a reference")]
    elif args.action == "import":
        (path,) = _need(args, "a path", exactly_one=True)
        records = [store.import_path(Path(path), args.reference, progress=progress)]
    elif args.action == "rm":
        for ref in _need(args, "a reference or image id"):
            store.remove(ref)
        store.gc()
        return 0
    elif args.action == "list":
        records = store.list_images()
    else:
        raise SystemExit("arl-tangram: image prefetch asks a server: give --url, not --config")
    views = [_record_view(r) for r in records]
    if args.json:
        print(json.dumps(views if args.action == "list" else views[-1] if len(views) == 1 else views, indent=2))
    elif args.action == "list":
        _print_images(views)
    else:
        for v in views:
            print(v["image_id"])
    return 0


def _need(args: argparse.Namespace, what: str, exactly_one: bool = False) -> list[str]:
    if not args.targets or (exactly_one and len(args.targets) != 1):
        raise SystemExit(f"arl-tangram: image {args.action} needs {'exactly one' if exactly_one else 'at least one'}: {what}")
    return list(args.targets)


def run_remote(http: Any, args: argparse.Namespace, request: Callable[..., Any]) -> int:
    """The action on the server behind ``http`` (``request``: the CLI's checked request)."""
    out: Any
    if args.action == "pull":
        raise SystemExit("arl-tangram: image pull acts on a node's store: give --config FILE (a server pulls with `image prefetch`)")
    if args.action == "list":
        out = request(http, "GET", "/v1/images")
        if not args.json:
            _print_images(out["images"])
            return 0
    elif args.action == "rm":
        for ref in _need(args, "a reference or image id"):
            request(http, "DELETE", f"/v1/images/{ref}")
        return 0
    elif args.action == "import":
        (path,) = _need(args, "a path on the server", exactly_one=True)
        body = {"path": path, **({"reference": args.reference} if args.reference else {})}
        out = request(http, "POST", "/v1/images", json=body)
    else:
        nodes = [n for n in args.nodes.split(",") if n]
        out = [request(http, "POST", "/v1/images", json={"reference": ref, "nodes": nodes}) for ref in _need(args, "a reference")]
        if not args.json:
            for o in out:
                print(f"{o['reference']}: pulling onto {', '.join(o['nodes'])}")
            return 0
    print(json.dumps(out, indent=2))
    return 0
