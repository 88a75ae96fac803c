"""``arl-tangram image ...`` through the CLI's entry point: on this node's store
(``--config``; pulls from a real loopback registry with progress lines, or a redrawn bar on
a TTY), and on a running server (prefetch, list, rm); an env created on an image by ``env
create --image``; bad input ends with a message naming the field."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from arl_tangram import cli
from tests.client.conftest import serving
from tests.images.kit import ImageKit

pytestmark = pytest.mark.usefixtures("sandbox_host")


def _config_file(kit: ImageKit, tmp_path: Path) -> str:
    path = tmp_path / "tangram.toml"
    path.write_text(f'[images]\nstore_path = "{tmp_path / "store"}"\n\n[[images.registries]]\nhost = "{kit.registry.host}"\ninsecure = true\n')
    return str(path)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_pull_import_list_rm_on_the_nodes_store(image_kit: ImageKit, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config_file(image_kit, tmp_path)
    assert cli.main(["image", "pull", image_kit.reference, "--config", config]) == 0
    out, err = capsys.readouterr()
    image_id = out.strip()
    assert image_id.startswith("sha256:") and len(image_id) == 71
    assert err.count(": fetch") == 2 and err.count(": unpack") == 2 and err.count(": done") == 2  # plain lines, per layer
    imported = f"{image_kit.registry.host}/swe/imported:v1"
    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    assert cli.main(["image", "import", str(image_kit.layout), "--reference", imported, "--config", config]) == 0
    assert "\r" in tty.getvalue() and "[" + "#" * 24 + "]" in tty.getvalue()  # a redrawn bar, full at the end
    monkeypatch.undo()
    assert capsys.readouterr().out.strip() == image_id  # same content: same image, no second unpack
    assert cli.main(["image", "list", "--json", "--config", config]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert sorted(listed["references"]) == sorted([image_kit.reference, imported]) and len(listed["layers"]) == 2
    assert cli.main(["image", "rm", image_kit.reference, imported, "--config", config]) == 0
    assert cli.main(["image", "list", "--config", config]) == 0
    assert capsys.readouterr().out == ""
    with pytest.raises(SystemExit, match="image.*must be"):
        cli.main(["image", "pull", "Bad Ref", "--config", config])
    with pytest.raises(SystemExit, match="404"):
        cli.main(["image", "pull", f"{image_kit.registry.host}/swe/missing:v1", "--config", config])


def test_prefetch_list_rm_and_an_env_on_a_server(image_kit: ImageKit, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serving(image_kit.config(tmp_path / "store")) as server:
        url = ["--url", server.url]
        assert cli.main(["image", "prefetch", image_kit.reference, *url]) == 0
        assert capsys.readouterr().out.strip() == f"{image_kit.reference}: pulling onto local/cpu"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert cli.main(["image", "list", "--json", *url]) == 0
            images = json.loads(capsys.readouterr().out)["images"]
            if images:
                break
            time.sleep(0.2)
        assert images[0]["references"] == [image_kit.reference] and images[0]["nodes"] == ["local/cpu"]
        assert cli.main(["env", "create", "--memory", "128MiB", "--image", image_kit.reference, *url]) == 0
        env_id = capsys.readouterr().out.strip()
        assert cli.main(["exec", env_id, "cat /etc/hostname; pwd", *url]) == 0
        assert capsys.readouterr().out == "image\n/testbed\n"
        assert cli.main(["env", "delete", env_id, *url]) == 0
        assert cli.main(["image", "rm", image_kit.reference, *url]) == 0
        assert cli.main(["image", "list", *url]) == 0 and capsys.readouterr().out == ""
        with pytest.raises(SystemExit, match="--config"):
            cli.main(["image", "pull", image_kit.reference, *url])
        with pytest.raises(SystemExit, match="HTTP 4.*reference"):
            cli.main(["image", "prefetch", "Bad Ref", *url])
