"""Shell: a mini-swe-agent / SkyRL environment class on ARL-Tangram (select it by dotted
path: ``environment_class: arl_tangram.integrations.minisweagent.TangramEnvironment``).

The protocol of mini-swe-agent v2 (as its ``LocalEnvironment``): ``execute(action, cwd="",
*, timeout=None)`` runs ``action["command"]`` (a plain string is taken as the command, the
v1 form) with ``bash`` and returns ``{"output": stdout and stderr interleaved,
"returncode", "exception_info"}``; a timeout or an infrastructure failure gives returncode
-1 and says why in ``exception_info``; output that starts with
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` raises mini-swe-agent's ``Submitted``. Each command
is one scheduled action in the environment's own sandbox, whose files persist across
commands; nothing else does (each command is a fresh ``bash``, as in mini-swe-agent's local
and docker environments). Synchronous: the agents are.

The stock configs run unchanged (``default.yaml``, ``mini.yaml``, ``swebench.yaml``'s
environment block): ``get_template_vars`` gives what the Local and Docker environments give
(the config, ``platform.uname()``'s ``system``/``release``/``version``/``machine``, the
caller's keys); ``interpreter`` runs each command (default ``bash -c``), ``image`` picks the
env's root (an image reference or id the server can pull; the images issue's config aliases
map public names to local ones), ``forward_env`` copies variables of this process, and the
Docker-only keys (``executable``, ``run_args``, ``container_timeout``, ``pull_timeout``)
are accepted and have no effect here.

GRPO groups: with ``group`` set (the task's id, the same for every rollout of one task) and
``setup`` (the task's setup command: clone, install, build), the first environment of the
group runs the setup and snapshots its env; the others of the group (in this process) fork
from that snapshot after it, without running the setup again (``integrations.groups``).
Needs an image env (``image``): the host root has no writable layer to snapshot.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

from arl_tangram.client import Client
from arl_tangram.integrations.connection import Endpoint
from arl_tangram.integrations.groups import BOARD

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@dataclass
class TangramEnvironmentConfig:
    """``url``/``token``: the server (no url: an embedded runtime in this process)."""

    url: str | None = None
    token: str | None = None
    memory: str = "2GiB"
    cwd: str = ""
    timeout: float = 60.0
    env: dict[str, str] = field(default_factory=dict)
    interpreter: list[str] = field(default_factory=lambda: ["bash", "-c"])
    image: str = "host"
    forward_env: list[str] = field(default_factory=list)
    # DockerEnvironment's keys, so that its config blocks load; they mean nothing here
    executable: str = ""
    run_args: list[str] = field(default_factory=list)
    container_timeout: str = ""
    pull_timeout: float = 0.0
    group: str = ""  # GRPO group key: members after the first fork from its set-up env
    setup: str = ""  # run once per group (by its first member), before the agent's commands


class TangramEnvironment:
    """One sandbox for one agent run; ``close()`` (or ``with``) releases it."""

    def __init__(self, **kwargs: Any) -> None:
        self.config = TangramEnvironmentConfig(**kwargs)
        endpoint = Endpoint.from_config({"tangram_url": self.config.url, "tangram_token": self.config.token})
        self._client: Client | None = Client(endpoint.url, token=endpoint.token)
        try:
            self._env = self._start(self._client)
        except BaseException:
            self._client.close()
            raise

    def _start(self, client: Client) -> Any:
        """The env: set up (as the group's leader, or alone), or from the group's snapshot."""
        c = self.config
        if not c.group:
            env = client.create_env(memory=c.memory, image=c.image)
            if c.setup:
                self._setup(env)
            return env
        leads, group = BOARD.join(c.group)
        if not leads:
            snapshot_id = BOARD.wait(group, max(c.timeout, 600.0))
            if snapshot_id is not None:
                return client.create_env(memory=c.memory, snapshot=snapshot_id)
        env = client.create_env(memory=c.memory, image=c.image)
        published = False
        try:
            if c.setup:
                self._setup(env)
            if leads:
                BOARD.publish(c.group, env.snapshot(f"group:{c.group}").snapshot_id)
                published = True
        finally:
            if leads and not published:
                BOARD.publish(c.group, None)  # the waiters set up on their own
        return env

    def _setup(self, env: Any) -> None:
        r = env.exec(["bash", "-c", "exec 2>&1\n" + self.config.setup], timeout_s=max(self.config.timeout, 600.0), kind="minisweagent:setup")
        if not r.ok:
            raise RuntimeError(f"setup: the task's setup ended {r.outcome} (exit {r.exit_code}): {r.stdout[-2000:]}")

    def execute(self, action: dict[str, Any] | str, cwd: str = "", *, timeout: float | None = None) -> dict[str, Any]:
        if self._client is None:
            raise RuntimeError("TangramEnvironment: execute after close(): the sandbox was released; make a new environment")
        command = action if isinstance(action, str) else str(action.get("command", ""))
        timeout_s = float(timeout or self.config.timeout)
        env = {**{k: os.environ[k] for k in self.config.forward_env if k in os.environ}, **self.config.env}
        r = self._env.exec(
            [*self.config.interpreter, "exec 2>&1\n" + command], cwd=cwd or self.config.cwd or None, env=env,
            timeout_s=timeout_s, kind="minisweagent",
        )  # fmt: skip
        if r.outcome in ("succeeded", "failed"):
            output = {"output": r.stdout, "returncode": r.exit_code, "exception_info": ""}
        else:
            why = f"the command timed out after {timeout_s:g} s" if r.outcome == "timed_out" else f"the command ended {r.outcome}: {r.cause or ''}"
            output = {"output": r.stdout, "returncode": -1, "exception_info": f"An error occurred while executing the command: {why}"}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        lines = output["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            try:
                from minisweagent.exceptions import Submitted
            except ImportError:  # used without mini-swe-agent: the caller reads the marker itself
                return
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}})

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config, ``platform.uname()`` (the stock templates' ``{{system}}`` and kin: the
        sandbox runs on this kernel when the server is local) and ``kwargs``, as the Local
        and Docker environments merge them."""
        return {**asdict(self.config), "token": None, "env_id": self._env.env_id, **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict[str, Any]:
        config = {**asdict(self.config), "token": None}  # never written into a trajectory file
        return {"info": {"config": {"environment": config, "environment_type": f"{__name__}.{type(self).__name__}"}}}

    def close(self) -> None:
        """Release the sandbox and the connection. Idempotent."""
        client, self._client = self._client, None
        if client is not None:
            try:
                self._env.release()
            finally:
                client.close()

    def __enter__(self) -> TangramEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
