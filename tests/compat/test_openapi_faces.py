"""``/openapi.json`` documents the compat faces (issue 27, item 8): a client generator or a
reviewer reading the schema of a served app (``create_app`` + ``mount_compat``, as ``serve``
builds it) finds every face's routes under the face's tag. (The schemathesis test fuzzes
an app without the faces: their contracts are their projects', checked with their clients.)"""

from __future__ import annotations

from arl_tangram.api.app import create_app
from arl_tangram.api.compat import mount_compat

FACES = {
    "sandboxfusion": ("/run_code", "/t/{token}/run_code", "/run_jupyter", "/v1/ping", "/t/{token}/v1/ping"),
    "swerex": ("/swerex/{env_id}/execute", "/swerex/{env_id}/upload", "/swerex/{env_id}/read_file", "/swerex/{env_id}/close"),
    "openai": ("/v1/embeddings", "/classify", "/v1/completions", "/v1/chat/completions", "/v1/models"),
}


def test_every_face_is_in_the_schema_under_its_tag() -> None:
    app = create_app()
    mount_compat(app)
    paths = app.openapi()["paths"]
    for tag, routes in FACES.items():
        for route in routes:
            assert route in paths, route
            assert all(tag in op["tags"] for op in paths[route].values()), (route, paths[route])
    run_code = paths["/run_code"]["post"]
    assert "RunCodeRequest" in str(run_code["requestBody"])  # the body's model, for a client generator
