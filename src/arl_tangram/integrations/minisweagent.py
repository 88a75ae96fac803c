"""Shell: a mini-swe-agent / SkyRL environment class on ARL-Tangram (select it by dotted
path: ``arl_tangram.integrations.minisweagent.TangramEnvironment``).

The protocol those agents use: ``execute(command, cwd="", *, timeout=None)`` runs one
``bash`` command line and returns ``{"output": stdout and stderr interleaved, "returncode"}``;
a timeout raises ``subprocess.TimeoutExpired`` as their local environment does (the agent
reports it to the model). Each command is one scheduled action in the environment's own
sandbox, whose files persist across commands; nothing else does (each command is a fresh
``bash``, as in mini-swe-agent's local and docker environments). Synchronous: the agents are.
"""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any

from arl_tangram.client import Client
from arl_tangram.integrations.connection import Endpoint


@dataclass
class TangramEnvironmentConfig:
    """``url``/``token``: the server (no url: an embedded runtime in this process)."""

    url: str | None = None
    token: str | None = None
    memory: str = "2GiB"
    cwd: str = ""
    timeout: float = 60.0
    env: dict[str, str] = field(default_factory=dict)


class TangramEnvironment:
    """One sandbox for one agent run; ``close()`` (or ``with``) releases it."""

    def __init__(self, **kwargs: Any) -> None:
        self.config = TangramEnvironmentConfig(**kwargs)
        endpoint = Endpoint.from_config({"tangram_url": self.config.url, "tangram_token": self.config.token})
        self._client = Client(endpoint.url, token=endpoint.token)
        try:
            self._env = self._client.create_env(memory=self.config.memory)
        except BaseException:
            self._client.close()
            raise

    def execute(self, command: str, cwd: str = "", *, timeout: float | None = None) -> dict[str, Any]:
        timeout_s = float(timeout or self.config.timeout)
        r = self._env.exec(
            ["bash", "-c", "exec 2>&1\n" + command], cwd=cwd or self.config.cwd or None, env=self.config.env,
            timeout_s=timeout_s, kind="minisweagent",
        )  # fmt: skip
        if r.outcome == "timed_out":
            raise subprocess.TimeoutExpired(command, timeout_s, output=r.stdout)
        if r.outcome not in ("succeeded", "failed"):
            raise RuntimeError(f"the command ended {r.outcome}: {r.cause or ''}")
        return {"output": r.stdout, "returncode": r.exit_code}

    def get_template_vars(self) -> dict[str, Any]:
        return {**asdict(self.config), "env_id": self._env.env_id}

    def close(self) -> None:
        """Release the sandbox and the connection. Idempotent."""
        if self._client is not None:
            client, self._client = self._client, None  # type: ignore[assignment]
            try:
                self._env.release()
            finally:
                client.close()

    def __enter__(self) -> TangramEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
