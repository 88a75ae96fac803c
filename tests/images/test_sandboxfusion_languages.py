"""Per-language images on the SandboxFusion face (issue 27, item 5): a language named in
``[sandboxfusion] language_images`` compiles and runs in a sandbox on that image, with the
face's own compile and run commands. The image is built here from host files: its ``go`` is
a stand-in (a script that "builds" main.go into a python3 program), since the host has no
Go; a language neither the host nor the config offers is still a 422 naming ``language``."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import httpx
import pytest

from arl_tangram.runtime.config_sandboxfusion import SandboxFusionConfig
from tests.compat.conftest import serve_compat
from tests.images.kit import ImageKit, tar_tree
from tests.managers.images.builders import write_oci_layout

pytestmark = pytest.mark.usefixtures("sandbox_host")
#: the image's "Go toolchain": ``go build -o main main.go`` makes ``main`` a python3 program
FAKE_GO = '#!/bin/sh\n[ "$1 $2" = "build -o" ] || exit 2\n{ echo "#!/usr/bin/python3"; cat "$4"; } > "$3" && chmod +x "$3"\n'
GO_CODE = "import sys\nprint(open('/etc/toolchain').read().strip(), sys.stdin.read().strip())\n"


def lang_image(kit: ImageKit, work: Path) -> str:
    tools = work / "tools"
    (tools / "usr/local/bin").mkdir(parents=True)
    (tools / "etc").mkdir()
    (tools / "usr/local/bin/go").write_text(FAKE_GO)
    os.chmod(tools / "usr/local/bin/go", 0o755)
    (tools / "etc/toolchain").write_text("go-from-the-image\n")
    write_oci_layout(work / "oci", [tar_tree(kit.work / "base"), tar_tree(tools)], tag="v1", config={"WorkingDir": "/"})
    return kit.registry.push(work / "oci", "sf/langs", "v1")


def test_a_configured_language_runs_in_its_image_and_others_are_refused(image_kit: ImageKit, tmp_path: Path) -> None:
    reference = lang_image(image_kit, tmp_path)
    config = replace(image_kit.config(tmp_path / "store"), sandboxfusion=SandboxFusionConfig(MappingProxyType({"go": reference})))
    with serve_compat(config) as server:
        run = httpx.post(f"{server.url}/run_code", json={"code": GO_CODE, "language": "go", "stdin": "hi",
                                                         "fetch_files": ["main"]}, timeout=120).json()  # fmt: skip
        assert run["status"] == "Success", run
        assert run["compile_result"]["return_code"] == 0 and run["run_result"]["stdout"] == "go-from-the-image hi\n"
        assert set(run["files"]) == {"main"}  # relative to the run's workspace, as on the host root
        host = httpx.post(f"{server.url}/run_code", json={"code": "print(open('/etc/hostname').read())"}, timeout=60).json()
        assert host["status"] == "Success" and "image" not in host["run_result"]["stdout"]  # python stays on the host
        refused = httpx.post(f"{server.url}/run_code", json={"code": "fn main() {}", "language": "lua"}, timeout=30)
        assert refused.status_code == 422 and refused.json()["field"] == "language", refused.text
        assert "go" in refused.json()["rule"] and "language_images" in refused.json()["rule"]
