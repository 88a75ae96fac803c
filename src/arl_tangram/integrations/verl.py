"""Shell: verl adapters (optional extra: needs ``verl``): ``TangramCodeTool``, a ``BaseTool``
whose sandbox lives across a trajectory's tool calls, and an async ``compute_score``.

verl's ``ToolAgentLoop`` calls a tool as ``create`` -> ``execute`` -> ``release`` for EVERY
call, with ``agent_data.request_id`` constant over a trajectory and no end-of-trajectory
hook. So the tool keys its env on that request id, not on the instance: the env (files,
installed packages) survives from call to call; ``release`` ends only the instance. Envs of
finished trajectories are reclaimed by the tool after ``env_idle_s`` without a call (checked
on every call) and, whatever happens to this process, by the server's lease. Swap
``SandboxFusionTool`` for it by changing only ``class_name``: its config keys
(``sandbox_fusion_url``, ``default_timeout``, ``default_language``, ``memory_limit_mb``) are
read, and the rate-limit ones (``num_workers``, ``rate_limit``, ``enable_global_rate_limit``)
are accepted and ignored: ARL-Tangram schedules every call as an action.

Tool YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``)::

    tools:
      - class_name: arl_tangram.integrations.verl.TangramCodeTool
        config:
          type: native
          sandbox_fusion_url: http://tangram:8080/t/<token>/run_code   # or tangram_url + tangram_token
          default_timeout: 30
          memory_limit_mb: 1024
          env_idle_s: 600
          create_timeout_s: 60      # a call whose env cannot be placed by then: a tool error, at once

GRPO groups (``group: true`` with ``image`` and ``setup``): the group key is verl's own
per-prompt id, ``uid`` in the batch's non-tensor data, which reaches the agent loop's
``run(**kwargs)`` but not its tools; select ``agent_name: tangram_tool_agent``
(``integrations.verl_group_loop``: verl's ``ToolAgentLoop`` that hands ``uid`` to the tools).
The first trajectory of a group creates the env and runs ``setup`` (the tool's first setup
call), then snapshots it; the group's other trajectories create their envs from that
snapshot (a fresh writable layer over it, on its node) instead of repeating the setup.

Reward (``reward.custom_reward_function``): ``path: pkg://arl_tangram.integrations.verl``
(verl imports the module: right for an editable install too), ``name: compute_score``,
``reward_kwargs: {tangram_url: http://tangram:8080, tangram_token: <token>, timeout: 10}``;
dataset rows carry ``reward_model.ground_truth`` = ``{"inputs": [...], "outputs": [...]}``
(or its JSON), verl's sandbox_fusion format; the completion's last fenced block is graded.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import uuid
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from arl_tangram.client import Env
from arl_tangram.integrations.connection import Endpoint, LazyClient
from arl_tangram.integrations.grading import extract_code, grade, parse_cases

#: the GRPO group (verl's ``uid``) of the trajectory this task runs; set by
#: ``verl_group_loop.TangramToolAgentLoop``, "" when unknown
GROUP_UID: contextvars.ContextVar[str] = contextvars.ContextVar("tangram_group_uid", default="")
RUNNERS = {
    "python": ("main.py", ["python3", "main.py"]),
    "bash": ("main.sh", ["bash", "main.sh"]),
    "cpp": ("main.cpp", ["bash", "-c", "g++ -O2 -std=c++17 -o main main.cpp && ./main"]),  # the host root's g++
}
DEFAULT_CREATE_TIMEOUT_S = 60.0  # a call that cannot get its env by then answers the model at once
CODE_SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run code in a sandbox that keeps its files across this conversation's calls.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The code to execute."},
                "language": {"type": "string", "enum": sorted(RUNNERS), "description": "Its language (default: the tool's)."},
            },
            "required": ["code"],
        },
    },
}


class TangramCodeTool(BaseTool):
    """A code interpreter on ARL-Tangram, one env per trajectory (see the module docstring)."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        super().__init__(config, tool_schema or OpenAIFunctionToolSchema.model_validate(CODE_SCHEMA))
        self.client = LazyClient(Endpoint.from_config(config))
        self.timeout_s = float(config.get("default_timeout", 30))
        self.language = str(config.get("default_language", "python"))
        if self.language not in RUNNERS:
            raise ValueError(f"default_language: must be one of {sorted(RUNNERS)} (got {self.language!r})")
        self.memory = f"{int(config.get('memory_limit_mb', 1024))}MiB"
        self.env_idle_s = float(config.get("env_idle_s", 600))
        self.create_timeout_s = float(config.get("create_timeout_s", DEFAULT_CREATE_TIMEOUT_S))
        self.envs: dict[str, Env] = {}  # trajectory request id -> its env
        self.last_used: dict[str, float] = {}
        self.instances: dict[str, str] = {}  # instance id -> trajectory key ("" until known)
        self._creating: dict[str, asyncio.Future[Env]] = {}
        self.image = str(config.get("image", "host"))
        self.group = bool(config.get("group", False))
        self.setup = str(config.get("setup", ""))
        if self.group and self.image == "host":
            raise ValueError("group: needs an image (a fork is of an image env's filesystem)")
        self._groups: dict[str, asyncio.Future[str | None]] = {}  # uid -> its snapshot (None: set up alone)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid.uuid4())
        self.instances[instance_id] = ""
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        """Run ``parameters["code"]`` in the trajectory's env; the text is stdout + stderr. A
        bad call (no ``code``, an unknown language) and an env that cannot be had within
        ``create_timeout_s`` answer the model with a text naming why, never an empty error."""
        agent_data = kwargs.get("agent_data")
        key = str(getattr(agent_data, "request_id", None) or instance_id)
        self.instances[instance_id] = key
        code, language = parameters.get("code"), str(parameters.get("language") or self.language)
        if not isinstance(code, str) or not code.strip():
            return ToolResponse(text="Error: code: the call needs the program to run, as a non-empty string"), 0.0, {"outcome": "rejected"}
        if language not in RUNNERS:
            return ToolResponse(text=f"Error: language: must be one of {sorted(RUNNERS)} (got {language!r})"), 0.0, {"outcome": "rejected"}
        await self._reclaim_idle()
        try:
            env = await self._env(key)
        except Exception as exc:  # noqa: BLE001 - the model (and verl's log) must read why
            why = "no node had room for it in time" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            text = f"Error: the sandbox is unavailable ({why}; waited at most {self.create_timeout_s:g} s for {self.memory})"
            return ToolResponse(text=text), 0.0, {"outcome": "error"}
        if agent_data is not None and isinstance(getattr(agent_data, "extra_fields", None), dict):
            agent_data.extra_fields["tangram_env_id"] = env.env_id  # compute_score may grade there
        source, argv = RUNNERS[language]
        await env.write_file(source, code)
        r = await env.exec(argv, timeout_s=self.timeout_s, kind="verl:code")
        self.last_used[key] = time.monotonic()
        text = r.stdout + r.stderr
        if r.outcome == "timed_out":
            text += f"\n[timed out after {self.timeout_s:g} s]"
        elif r.outcome not in ("succeeded", "failed"):
            text += f"\n[sandbox error: {r.cause or r.outcome}]"
        return ToolResponse(text=text), 0.0, {"outcome": r.outcome, "exit_code": r.exit_code, "act_s": r.act_s}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Ends the instance; the trajectory's env stays for its next call. An instance
        that never learnt its trajectory had an env of its own: that one goes now."""
        key = self.instances.pop(instance_id, None)
        if key == instance_id:
            await self._drop(key)

    async def _env(self, key: str) -> Env:
        if key in self.envs:
            return self.envs[key]
        if key not in self._creating:  # concurrent calls of one trajectory share one creation
            self._creating[key] = asyncio.ensure_future(self._create_env(key))
        task = self._creating[key]
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._creating.pop(key, None)

    async def _placed(self, client: Any, **spec: Any) -> Env:
        """``create_env`` bounded by ``create_timeout_s`` (a group's setup is not: it is work,
        not waiting); on the timeout the request is abandoned, and the server releases an env
        made for no one."""
        return await asyncio.wait_for(client.create_env(memory=self.memory, **spec), self.create_timeout_s)

    async def _create_env(self, key: str) -> Env:
        client = await self.client.get()
        uid = GROUP_UID.get() if self.group else ""
        snapshot_id = None
        if uid and uid in self._groups:  # a later trajectory of the group: from its snapshot
            snapshot_id = await asyncio.shield(self._groups[uid])
        if snapshot_id is not None:
            env = await self._placed(client, trajectory_id=key[:128], snapshot=snapshot_id)
        else:
            leads = bool(uid) and uid not in self._groups
            done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            if leads:
                self._groups[uid] = done
            try:
                env = await self._placed(client, trajectory_id=key[:128], image=self.image)
                if self.setup:
                    r = await env.exec(["bash", "-c", self.setup], timeout_s=max(self.timeout_s, 600.0), kind="verl:setup")
                    if not r.ok:
                        raise RuntimeError(f"setup: ended {r.outcome} (exit {r.exit_code}): {(r.stdout + r.stderr)[-2000:]}")
                if leads:
                    done.set_result((await env.snapshot(f"group:{uid}")).snapshot_id)
            finally:
                if leads and not done.done():
                    done.set_result(None)  # the group's others set up on their own
        self.envs[key] = env
        self.last_used[key] = time.monotonic()
        return env

    async def _reclaim_idle(self) -> None:
        horizon = time.monotonic() - self.env_idle_s
        for key in [k for k, t in self.last_used.items() if t < horizon and k not in self.instances.values()]:
            await self._drop(key)

    async def _drop(self, key: str) -> None:
        self.last_used.pop(key, None)
        env = self.envs.pop(key, None)
        if env is not None:
            await env.release()

    async def aclose(self) -> None:
        """Release every env and the connection (tests, shutdown)."""
        for key in list(self.envs):
            await self._drop(key)
        await self.client.aclose()


_score_clients: dict[Endpoint, LazyClient] = {}


async def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None, *,
    tangram_url: str | None = None, tangram_token: str | None = None, sandbox_fusion_url: str | None = None,
    timeout: float = 10.0, memory_limit_mb: int = 1024, max_dop: int = 16, **_: Any,
) -> dict[str, Any]:  # fmt: skip
    """verl's ``reward.custom_reward_function`` (``reward_kwargs`` give the server): the
    fraction of ``ground_truth``'s stdin/stdout cases the completion's last code block
    passes, graded in ONE elastic action (see ``grading``): in the trajectory's own env
    when ``extra_info["tangram_env_id"]`` names a live one (the tool records it in the
    rollout's ``extra_fields``), else on a fresh env. Returns ``{"score", "acc",
    "verdicts"}``; no code block scores 0, and so does a ground truth verl's scorer cannot read
    (verl's rule: the row scores 0 with an ``error``, the run goes on)."""
    code = extract_code(solution_str)
    try:
        cases = parse_cases(ground_truth)
    except ValueError as exc:
        return {"score": 0.0, "acc": False, "verdicts": [], "error": str(exc)}
    if code is None or not cases:
        return {"score": 0.0, "acc": False, "verdicts": []}
    endpoint = Endpoint.from_config({"tangram_url": tangram_url, "tangram_token": tangram_token, "sandbox_fusion_url": sandbox_fusion_url})
    client = await _score_clients.setdefault(endpoint, LazyClient(endpoint)).get()
    own = (extra_info or {}).get("tangram_env_id")
    if own:
        try:  # the trajectory's env, not ours to release
            verdicts = await grade(Env(client, str(own), ""), code, cases, timeout_s=float(timeout), max_dop=max_dop)
        except Exception:  # noqa: BLE001 - gone (its lease ran out): grade on a fresh env
            own = None
    if not own:
        async with await client.create_env(memory=f"{int(memory_limit_mb)}MiB") as env:
            verdicts = await grade(env, code, cases, timeout_s=float(timeout), max_dop=max_dop)
    passed = sum(1 for v in verdicts if v is True)
    return {"score": passed / len(cases), "acc": passed == len(cases), "verdicts": verdicts}


async def close_score_clients() -> None:
    """Close ``compute_score``'s connections (at the end of a run, or of a test)."""
    while _score_clients:
        await _score_clients.popitem()[1].aclose()
