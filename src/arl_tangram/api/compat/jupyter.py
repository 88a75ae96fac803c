"""Shell: SandboxFusion's ``/run_jupyter``: notebook cells in one Python process, one action.

No Jupyter kernel is needed: a small driver runs the cells in one shared namespace (so a
cell sees what earlier cells defined, as in a kernel), captures each cell's stdout and
stderr, shows the value of a cell's last expression as ``display`` (``text/plain``), and
reports an exception as ``error`` (``ename``, ``evalue``, ``traceback``) and stops there, as
a notebook run stops at the first failing cell. ``cell_timeout`` (> 0) bounds each cell
(SIGALRM in the driver); ``total_timeout`` bounds the whole action. The driver rewrites its
results file after every cell, so the cells that finished are reported even when the
total timeout kills it.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from arl_tangram.api.compat import sandboxfusion as sf
from arl_tangram.api.compat.pool import run_env_action
from arl_tangram.api.compat.sandboxfusion import MAX_FILES, MAX_TIMEOUT_S, router, serve
from arl_tangram.api.compat.tenancy import CompatState
from arl_tangram.runtime.actions import ExecPayload
from arl_tangram.runtime.controller import EnvFailedError


class RunJupyterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    cells: list[str]
    cell_timeout: float = Field(0.0, ge=0, le=MAX_TIMEOUT_S)
    total_timeout: float = Field(45.0, gt=0, le=MAX_TIMEOUT_S)
    kernel: Literal["python3"] = "python3"
    files: dict[str, str | None] = Field(default_factory=dict, max_length=MAX_FILES)
    fetch_files: list[str] = Field(default_factory=list, max_length=MAX_FILES)

DRIVER = r'''
import ast, contextlib, io, json, signal, sys, traceback
cells = json.load(open("/tmp/.jupyter_cells.json"))
cell_timeout = float(sys.argv[1])
ns = {"__name__": "__main__"}
out = []
def save():
    with open("/tmp/.jupyter_results.tmp", "w") as f:
        json.dump(out, f)
    import os; os.replace("/tmp/.jupyter_results.tmp", "/tmp/.jupyter_results.json")
def on_alarm(signum, frame):
    raise TimeoutError(f"cell timed out after {cell_timeout} s")
signal.signal(signal.SIGALRM, on_alarm)
for source in cells:
    o, e, cell = io.StringIO(), io.StringIO(), {"stdout": "", "stderr": "", "display": [], "error": []}
    try:
        tree = ast.parse(source, "<cell>", "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        if cell_timeout > 0:
            signal.setitimer(signal.ITIMER_REAL, cell_timeout)
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            exec(compile(tree, "<cell>", "exec"), ns)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), ns)
                if value is not None:
                    cell["display"].append({"text/plain": repr(value)})
    except BaseException as exc:
        cell["error"].append({"ename": type(exc).__name__, "evalue": str(exc),
                              "traceback": traceback.format_exception(exc)})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    cell["stdout"], cell["stderr"] = o.getvalue(), e.getvalue()
    out.append(cell)
    save()
    if cell["error"]:
        break
save()
'''


async def run_jupyter(compat: CompatState, tenant: str, body: RunJupyterRequest) -> dict[str, Any]:
    """Run the cells (see the module docstring) in a pooled sandbox; the same status rules
    and errors as ``run_code``. A cell that raised makes the run ``Failed``."""
    files = sf.decode_files(body.files)
    mem_bytes = compat.settings.default_mem_bytes
    try:
        env_id = await compat.pool.acquire(tenant, mem_bytes)
    except EnvFailedError as exc:
        return sf._sandbox_error(str(exc))
    reusable = False
    try:
        driver_files = {"/tmp/.jupyter_driver.py": DRIVER.encode(), "/tmp/.jupyter_cells.json": json.dumps(body.cells).encode()}
        await sf._write(compat, env_id, {**files, **driver_files})
        argv = ("python3", "/tmp/.jupyter_driver.py", repr(body.cell_timeout))
        r = await run_env_action(compat.api, tenant, env_id, "sf:jupyter", ExecPayload(argv, None, (), None, body.total_timeout))
        driver = sf.command_result(r)
        raw = await sf.fetch(compat, env_id, ["/tmp/.jupyter_results.json"])
        cells = json.loads(_b64(raw.get("/tmp/.jupyter_results.json", ""))) if raw else []
        status, message = sf.overall_status(driver)
        if status == "Success" and any(c["error"] for c in cells):
            status = "Failed"
        fetched = await sf.fetch(compat, env_id, body.fetch_files) if body.fetch_files else {}
        reusable = status != "SandboxError"
        return {"status": status, "message": message, "driver": driver, "cells": cells, "executor_pod_name": r.node_id, "files": fetched}
    finally:
        compat.pool.release(tenant, mem_bytes, env_id, reusable=reusable)


def _b64(text: str) -> str:
    import base64

    return base64.b64decode(text).decode() if text else "[]"


@router.post("/run_jupyter")
@router.post("/t/{token}/run_jupyter")
async def run_jupyter_route(request: Request, body: RunJupyterRequest) -> Any:
    """On the SandboxFusion face's router (``sandboxfusion.router``): this module registers
    it, so the face imports nothing of the notebook driver."""
    return await serve(request, lambda compat, tenant: run_jupyter(compat, tenant, body))
