"""Shell: ``arl-tangram bench images [--json] [--quick]``: environment images, measured on
the real parts (a loopback docker-registry, the node's ``ImageStore``, the embedded
runtime's scheduler and real sandboxes), with exactly the keys of the images issue:

- ``create_warm_p50_ms``/``create_warm_p99_ms``: ``create_env`` on an image whose layers are
  on the node, 16 concurrent creators;
- ``create_cold_s`` with ``cold_image_bytes``: the first env on a node without the layers;
- ``pull_unpack_mb_per_s`` (MiB of unpacked bytes per second, a store's pull from the
  registry) beside ``tar_x_mb_per_s`` (``tar -xzf`` of the same layer blobs);
- ``store_bytes_ratio``: ``du`` of a store holding 10 task images over one shared base / the
  sum of the 10 images' unpacked sizes (each task layer >= 5 MiB at full size);
- ``blob_fetches_per_layer_in_burst``: 64 envs of one uncached image created at once,
  layer blob GETs at the registry's access log (manifests excluded) per distinct layer;
- ``exec_true_p50_ms_image``/``exec_true_p50_ms_host``: ``exec("true")``, interleaved;
- ``swe_task_ok``: a SWE-style task through SWE-ReX's unchanged ``RemoteRuntime``.
Envs use ``memory="128MiB"``. The full base is Debian bookworm + python3 (``mmdebstrap``,
cached); ``--quick`` uses a small base from host files and smaller counts (tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import arl_tangram
from arl_tangram.bench import image_kit as kit
from arl_tangram.bench.overhead_http import server_process
from arl_tangram.runtime.config import TangramConfig
from arl_tangram.runtime.config_images import ImagesConfig, RegistryConfig, make_image_store

MIB = 1 << 20
MEMORY = "128MiB"
NUM_TASKS = 10
#: figures beside the issue's keys (sample counts, host-root creates under the same load):
#: printed on stderr, so the JSON holds exactly the issue's keys
CONTEXT = "_context"
KEYS = (
    "create_warm_p50_ms", "create_warm_p99_ms", "create_cold_s", "cold_image_bytes", "pull_unpack_mb_per_s",
    "tar_x_mb_per_s", "store_bytes_ratio", "blob_fetches_per_layer_in_burst", "exec_true_p50_ms_image",
    "exec_true_p50_ms_host", "swe_task_ok",
)  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    filler_bytes: int  # per task layer
    warm_per_creator: int  # 16 creators, each this many creates
    burst_envs: int
    execs: int


FULL = Sizes(filler_bytes=5 * MIB, warm_per_creator=8, burst_envs=64, execs=200)
QUICK = Sizes(filler_bytes=1 * MIB, warm_per_creator=1, burst_envs=8, execs=10)


@dataclass(frozen=True)
class Setup:
    work: Path
    registry: kit.LoopbackRegistry
    layout: kit.Layout
    refs: list[str]  # task images
    blobs: list[list[kit.Blob]]  # each task image's layer blobs, lowest first
    burst_ref: str
    burst_blobs: list[kit.Blob]

    def config(self, store: str) -> TangramConfig:
        reg = RegistryConfig(host=self.registry.host, insecure=True)
        return TangramConfig(images=ImagesConfig(store_path=str(self.work / store), registries=(reg,), max_store_bytes=64 << 30))


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def build(work: Path, sizes: Sizes, quick: bool) -> Setup:
    base = kit.host_base_tar(work) if quick else kit.debian_base_tar()
    layout = kit.Layout(work / "oci")
    blobs = [layout.add_image(f"task-{i}", [base, kit.task_tar(work, i, sizes.filler_bytes)]) for i in range(NUM_TASKS)]
    burst_blobs = layout.add_image("burst", [base, kit.task_tar(work, NUM_TASKS, sizes.filler_bytes)])
    registry = kit.LoopbackRegistry(work / "registry")
    try:
        refs = [registry.push(layout.root, f"task-{i}") for i in range(NUM_TASKS)]
        burst_ref = registry.push(layout.root, "burst")
    except BaseException:
        registry.stop()
        raise
    return Setup(work, registry, layout, refs, blobs, burst_ref, burst_blobs)


def measure_store(setup: Setup) -> dict[str, Any]:
    """A store's own pull rate (fresh store, first image) beside ``tar -xzf`` of the same
    blobs; then the 10 images' on-disk footprint over their summed sizes."""
    store = make_image_store(setup.config("store-only").images)  # type: ignore[arg-type]
    try:
        started = time.perf_counter()
        first = store.pull(setup.refs[0])
        pull_s = time.perf_counter() - started
        records = [first] + [store.pull(ref) for ref in setup.refs[1:]]
    finally:
        store.close()
    dest = setup.work / "tar-x"
    dest.mkdir()
    started = time.perf_counter()
    for i, blob in enumerate(setup.blobs[0]):
        (dest / str(i)).mkdir()
        subprocess.run(["tar", "-xzf", str(blob.path), "-C", str(dest / str(i)), "--numeric-owner"], check=True)
    tar_s = time.perf_counter() - started
    shutil.rmtree(dest)
    du = subprocess.run(["du", "-s", "--block-size=1", str(setup.work / "store-only")], capture_output=True, text=True, check=True)
    return {
        "pull_unpack_mb_per_s": round(first.size_bytes / MIB / pull_s, 1),
        "tar_x_mb_per_s": round(first.size_bytes / MIB / tar_s, 1),
        "store_bytes_ratio": round(int(du.stdout.split()[0]) / sum(r.size_bytes for r in records), 4),
        "cold_image_bytes": first.size_bytes,  # the image the cold create pulls
        CONTEXT: {"store_images": len(records), "store_du_bytes": int(du.stdout.split()[0])},
    }


async def _host_creates(tg: Any, sizes: Sizes) -> list[float]:
    """The same 16 creators on the host root: what this machine's load costs any create."""
    samples: list[float] = []

    async def creator() -> None:
        for _ in range(sizes.warm_per_creator):
            t0 = time.perf_counter()
            e = await tg.create_env(memory=MEMORY)
            samples.append((time.perf_counter() - t0) * 1000)
            await e.release()

    await asyncio.gather(*(creator() for _ in range(16)))
    return samples


async def measure_envs(setup: Setup, sizes: Sizes) -> dict[str, Any]:
    """Cold create, then warm creates by 16 creators, then exec ``true`` image vs host."""
    async with arl_tangram.connect(config=setup.config("store-envs")) as tg:
        started = time.perf_counter()
        env = await tg.create_env(image=setup.refs[0], memory=MEMORY)
        cold_s = time.perf_counter() - started
        samples: list[float] = []

        async def creator() -> None:
            for _ in range(sizes.warm_per_creator):
                t0 = time.perf_counter()
                e = await tg.create_env(image=setup.refs[0], memory=MEMORY)
                samples.append((time.perf_counter() - t0) * 1000)
                await e.release()

        await asyncio.gather(*(creator() for _ in range(16)))
        host_samples = await _host_creates(tg, sizes)
        host = await tg.create_env(memory=MEMORY)
        on_image: list[float] = []
        on_host: list[float] = []
        for _ in range(sizes.execs):
            for target, out in ((env, on_image), (host, on_host)):
                t0 = time.perf_counter()
                r = await target.exec("true")
                out.append((time.perf_counter() - t0) * 1000)
                assert r.ok, r
        await host.release()
        await env.release()
    return {
        "create_warm_p50_ms": _pct(samples, 0.5), "create_warm_p99_ms": _pct(samples, 0.99),
        CONTEXT: {"create_warm_samples": len(samples), "create_host_p50_ms": _pct(host_samples, 0.5),
                  "create_host_p99_ms": _pct(host_samples, 0.99)},
        "create_cold_s": round(cold_s, 3),
        "exec_true_p50_ms_image": _pct(on_image, 0.5), "exec_true_p50_ms_host": _pct(on_host, 0.5),
    }  # fmt: skip


async def measure_burst(setup: Setup, sizes: Sizes) -> dict[str, Any]:
    """``burst_envs`` creations of one image no store on this node holds, all at once."""
    digests = [b.digest for b in setup.burst_blobs]
    before = setup.registry.blob_gets()
    async with arl_tangram.connect(config=setup.config("store-burst")) as tg:
        started = time.perf_counter()
        envs = await asyncio.gather(*(tg.create_env(image=setup.burst_ref, memory=MEMORY) for _ in range(sizes.burst_envs)))
        burst_s = time.perf_counter() - started
        after = setup.registry.blob_gets()
        for e in envs:
            await e.release()
    fetches = sum(after[d] - before[d] for d in digests)
    return {"blob_fetches_per_layer_in_burst": round(fetches / len(digests), 3),
            CONTEXT: {"burst_envs": len(envs), "burst_s": round(burst_s, 3), "burst_layers": len(digests)}}


async def swe_task(setup: Setup) -> dict[str, Any]:
    """The SWE-ReX face on an image env: the test fails, a patch is uploaded and applied, it passes."""
    try:
        from swerex.runtime.abstract import BashAction, CreateBashSessionRequest, UploadRequest
        from swerex.runtime.remote import RemoteRuntime
    except ImportError as exc:  # the swe-rex client is optional; say so in the figures
        return {"swe_task_ok": False, "swe_task_error": f"swe-rex not installed: {exc}"}
    patch = setup.work / "patch"
    patch.mkdir()
    (patch / "calc.py").write_text(kit.FIXED)
    config = setup.work / "swe.toml"  # the server's own store, pulling from the loopback registry
    config.write_text(f'[images]\nstore_path = "{setup.work / "store-swe"}"\n\n'
                      f'[[images.registries]]\nhost = "{setup.registry.host}"\ninsecure = true\n')  # fmt: skip
    with server_process(extra_args=("--config", str(config))) as url:
        async with arl_tangram.connect(url) as tg:
            env = await tg.create_env(image=setup.refs[1], memory=MEMORY)
            quiet = logging.getLogger("arl-tangram.bench.swerex")  # its own logger logs every upload at DEBUG
            quiet.setLevel(logging.WARNING)
            rt = RemoteRuntime(host=f"{url}/swerex/{env.env_id}", port=None, auth_token="", logger=quiet)
            await rt.create_session(CreateBashSessionRequest())
            await rt.run_in_session(BashAction(command="cd /testbed"))
            failing = await rt.run_in_session(BashAction(command="python3 test_calc.py", check="silent"))
            await rt.upload(UploadRequest(source_path=str(patch), target_path="/testbed/.patch"))
            await rt.run_in_session(BashAction(command="cp .patch/calc.py calc.py"))
            passing = await rt.run_in_session(BashAction(command="python3 test_calc.py", check="silent"))
            await rt.close()
            await env.release()
    return {"swe_task_ok": failing.exit_code == 1 and passing.exit_code == 0 and passing.output.strip() == "ok"}


async def measure(quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the issue's keys, context figures)."""
    sizes = QUICK if quick else FULL
    work = Path(tempfile.mkdtemp(prefix=f"arl-tangram-{os.getpid()}-bench-images-"))
    try:
        setup = await asyncio.to_thread(build, work, sizes, quick)
        try:
            parts = [await asyncio.to_thread(measure_store, setup), await measure_envs(setup, sizes),
                     await measure_burst(setup, sizes), await swe_task(setup)]  # fmt: skip
        finally:
            setup.registry.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    context: dict[str, Any] = {"base": "host files" if quick else "debian bookworm minbase + python3 (mmdebstrap)"}
    result: dict[str, Any] = {}
    for part in parts:
        context.update(part.pop(CONTEXT, {}))
        result.update(part)
    context.update({k: result.pop(k) for k in list(result) if k not in KEYS})  # e.g. why the SWE task failed
    return {key: result[key] for key in KEYS}, context


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arl-tangram bench images", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="a base from host files and small counts (tests)")
    args = parser.parse_args(argv)
    print("bench images: building images and measuring (minutes at full size)...", file=sys.stderr)
    result, context = asyncio.run(measure(args.quick))
    print("bench images: context: " + json.dumps(context), file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:36s} {value}")
    return 0
