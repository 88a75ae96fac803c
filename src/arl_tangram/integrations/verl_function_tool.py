"""Shell: a verl ``@function_tool`` (``tangram_run_python``) running code on ARL-Tangram.

Load it with verl's rollout ``function_tool_path`` pointing at this file. Function tools are
stateless in verl (no instance, no trajectory id), so every call runs in a fresh env that
is released when the call ends; use ``TangramCodeTool`` (verl.py) for state across a
trajectory. The server comes from ``ARL_TANGRAM_URL`` / ``ARL_TANGRAM_TOKEN`` (unset: the
embedded runtime in this process).
"""

from __future__ import annotations

import os

from verl.tools.function_tool import function_tool

from arl_tangram.integrations.connection import Endpoint, LazyClient

_client = LazyClient(Endpoint.from_config({"tangram_url": os.environ.get("ARL_TANGRAM_URL"), "tangram_token": os.environ.get("ARL_TANGRAM_TOKEN")}))


@function_tool("tangram_run_python")
async def tangram_run_python(code: str, stdin: str = "") -> str:
    """Run a Python program in a fresh sandbox and return what it printed.

    Args:
        code: The Python program to run.
        stdin: Text given to the program on standard input.
    """
    client = await _client.get()
    async with await client.create_env(memory="1GiB") as env:
        await env.write_file("main.py", code)
        r = await env.exec(["python3", "main.py"], stdin=stdin, timeout_s=30.0, kind="verl:function_tool")
    suffix = "" if r.outcome in ("succeeded", "failed") else f"\n[{r.outcome}: {r.cause or ''}]"
    return r.stdout + r.stderr + suffix
