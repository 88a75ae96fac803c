"""The E2B face on an image: the unchanged ``e2b`` SDK creates a sandbox whose template is
an image built in the tests (an ``[e2b] templates`` alias, or slime's way: the image in the
``image`` metadata key), runs a SWE-style task in it (the image's ``WorkingDir`` is the
commands' cwd, its files are the sandbox's), and kills it."""

from __future__ import annotations

from pathlib import Path

import pytest

from arl_tangram.runtime.config_e2b import E2bConfig
from tests.compat.conftest import serve_compat
from tests.images.kit import FIXED, ImageKit

pytest.importorskip("e2b", reason="the e2b client package is not installed")
from e2b import CommandExitException, Sandbox  # noqa: E402

pytestmark = pytest.mark.usefixtures("sandbox_host")


def test_templates_are_images_by_alias_or_slimes_metadata_key(image_kit: ImageKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = image_kit.config(tmp_path / "store")
    config = type(config)(images=config.images, e2b=E2bConfig(mem_bytes=256 << 20, templates={"base": "host", "calc": image_kit.reference}))
    with serve_compat(config) as server:
        for name, value in (("E2B_API_URL", f"{server.url}/e2b"), ("E2B_SANDBOX_URL", f"{server.url}/e2b"), ("E2B_API_KEY", "e2b_" + "0" * 40)):
            monkeypatch.setenv(name, value)
        by_alias = Sandbox.create("calc", timeout=60)
        try:
            assert by_alias.commands.run("pwd; echo $TASK").stdout == "/testbed\ncalc\n"  # the image's WorkingDir and Env
            with pytest.raises(CommandExitException, match="add is wrong"):
                by_alias.commands.run("python3 test_calc.py")
            by_alias.files.write("calc.py", FIXED)  # relative: the image's WorkingDir
            assert by_alias.commands.run("python3 test_calc.py").stdout == "ok\n"
            assert {e.name for e in by_alias.files.list("/testbed")} >= {"calc.py", "test_calc.py"}
        finally:
            by_alias.kill()
        slime = Sandbox.create("base", timeout=60, metadata={"image": image_kit.reference})  # slime's image key
        try:
            assert slime.files.read("/testbed/calc.py").startswith("def add")
            assert slime.get_info().metadata == {"image": image_kit.reference}
        finally:
            slime.kill()
