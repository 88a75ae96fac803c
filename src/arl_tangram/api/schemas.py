"""Shell: the wire format of the native ``/v1`` API, as pydantic models (they are the OpenAPI schema).

Each model validates shape and ranges only; the rules that need the live system (does this
env exist, does this memory fit a node) are checked by the handlers, and the core's own
``SpecError`` s name their field too. Ids the client chooses are restricted to what a
sandbox id may hold, so an internal, tenant-scoped id is always a valid sandbox id.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: client-chosen ids: the tenant prefix and a dot are added internally, within 64 characters
ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,46}$"
SIZE_PATTERN = r"^\s*\d+(\.\d+)?\s*([KMGTkmgt]i?[Bb]|[Bb])?\s*$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,127}$"

ExternalId = Annotated[str, Field(pattern=ID_PATTERN)]
Size = Annotated[int, Field(ge=1)] | Annotated[str, Field(pattern=SIZE_PATTERN, max_length=32)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- envs ----------------------------------------------------------------------------------
class EnvCreate(_Strict):
    """A stateful sandbox: memory held for its life, zero CPU while idle."""

    env_id: ExternalId | None = Field(None, description="client-chosen id; a uuid4-based one when absent")
    image: Literal["host", "python"] = "host"
    memory: Size = "1GiB"
    pids_max: int = Field(512, ge=8, le=65536)
    workspace: Size = "512MiB"
    tmp: Size = "256MiB"
    trajectory_id: str = Field("", max_length=128)


class EnvView(BaseModel):
    env_id: str
    mem_bytes: int
    trajectory_id: str = ""
    ready: bool = False
    num_running: int = 0


class EnvList(BaseModel):
    envs: list[EnvView]


class SessionCreate(_Strict):
    env: dict[str, str] | None = None
    cwd: str | None = Field(None, max_length=4096)


class SessionView(BaseModel):
    session_id: str


# -- actions -------------------------------------------------------------------------------
class Elasticity(_Strict):
    """The action's DoP range on its key resource and, optionally, its curve (an Amdahl
    ``serial_fraction`` or a ``table`` of efficiencies); without one the kind's learned curve."""

    min: int = Field(1, ge=1, le=1024)
    max: int = Field(1, ge=1, le=1024)
    serial_fraction: float | None = Field(None, ge=0.0, le=1.0)
    table: list[Annotated[float, Field(gt=0.0, le=1.0)]] | None = Field(None, min_length=1, max_length=1024)


class _ActionBase(_Strict):
    action_id: ExternalId | None = Field(None, description="client-chosen id; a uuid4-based one when absent")
    kind: str | None = Field(None, min_length=1, max_length=128, description="label for learned estimates")
    trajectory_id: str = Field("", max_length=128)
    timeout_s: float | None = Field(None, gt=0.0, le=86400.0)
    retryable: bool = Field(
        False,
        description="running it twice is harmless: if its node is lost it is retried on another "
        "(not when its env went with the node); its result's attempts says how often it started",
    )


class ExecAction(_ActionBase):
    """A ``bash -c`` string or an argv in an env's sandbox (or one of its sessions)."""

    type: Literal["exec"]
    env_id: ExternalId
    command: Annotated[str, Field(min_length=1, max_length=1 << 20)] | Annotated[list[str], Field(min_length=1, max_length=4096)]
    stdin: str | None = Field(None, max_length=16 << 20)
    stdin_b64: str | None = Field(None, max_length=22 << 20)
    env: dict[str, str] | None = None
    cwd: str | None = Field(None, max_length=4096)
    session_id: str | None = Field(None, max_length=128)
    cpu: Elasticity = Field(default_factory=lambda: Elasticity.model_validate({}))
    t_ori_s: float | None = Field(None, gt=0.0, le=86400.0)


class CodeAction(_ActionBase):
    """Source code run by an interpreter in an env's sandbox (the code is its stdin)."""

    type: Literal["code"]
    env_id: ExternalId
    code: str = Field(max_length=16 << 20)
    language: Literal["python", "bash"] = "python"
    cpu: Elasticity = Field(default_factory=lambda: Elasticity.model_validate({}))
    t_ori_s: float | None = Field(None, gt=0.0, le=86400.0)


class ServiceAction(_ActionBase):
    """A request to a model service (the tenant's own, else one the operator registered)."""

    type: Literal["service"]
    service: str = Field(pattern=NAME_PATTERN)
    request: Any = None
    devices: Elasticity | None = None


class ApiAction(_ActionBase):
    """A call to a quota-managed API provider."""

    type: Literal["api"]
    provider: str = Field(pattern=NAME_PATTERN)
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    path: str = Field("/", pattern=r"^/", max_length=4096)
    json_body: Any = Field(None, alias="json")
    params: dict[str, str] | None = None
    tokens: int | None = Field(None, ge=0)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class NoopAction(_ActionBase):
    """An action that needs no resource (health checks; the floor of the overhead)."""

    type: Literal["noop"]


ActionCreate = Annotated[
    ExecAction | CodeAction | ServiceAction | ApiAction | NoopAction, Field(discriminator="type")
]


class ResultView(BaseModel):
    """The action's one terminal result; ``act_s = queue_s + exec_s + overhead_s``."""

    outcome: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output: Any = None
    queue_s: float = 0.0
    exec_s: float = 0.0
    overhead_s: float = 0.0
    act_s: float = 0.0
    dop: int | None = None
    node_id: str | None = None
    cause: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    cpu_s: float = 0.0
    peak_mem_bytes: int = 0
    attempts: int = 1


class ActionView(BaseModel):
    """An action as its owner sees it: ``state`` is ``queued``, ``running`` or ``done``
    (then ``result`` holds the outcome). Times are Unix seconds."""

    action_id: str
    type: str
    kind: str
    state: Literal["queued", "running", "done"]
    submitted_at: float
    started_at: float | None = None
    result: ResultView | None = None


# -- services and providers ----------------------------------------------------------------
class ServiceCreate(_Strict):
    """A model service from a local safetensors folder or a ``package.module:factory``."""

    name: str = Field(pattern=NAME_PATTERN)
    handler: Literal["embed", "score", "logprobs", "classify", "generate"]
    folder: str | None = Field(None, min_length=1, max_length=4096)
    module: str | None = Field(None, pattern=r"^[\w.]+:\w+$", max_length=512)
    devices_min: Literal[1, 2, 4, 8] = 1
    devices_max: Literal[1, 2, 4, 8] = 1
    max_batch: int | None = Field(None, ge=1, le=1024)  # generate: sequences decoded together
    max_context_tokens: int | None = Field(None, ge=2)  # generate: prompt + new tokens


class ServiceView(BaseModel):
    name: str
    shared: bool
    weight_bytes: int
    devices_min: int
    devices_max: int
    state: str = "registered"
    num_replicas: int = 0


class ServiceList(BaseModel):
    services: list[ServiceView]


class ProviderView(BaseModel):
    name: str
    in_flight: int = 0
    waiting: int = 0
    upstream_429s: int = 0
    waits: int = 0
    tokens_used: int = 0


class ProviderList(BaseModel):
    providers: list[ProviderView]


# -- the service itself --------------------------------------------------------------------
class Health(BaseModel):
    status: Literal["ok", "closing"]
    version: str


class ErrorBody(BaseModel):
    """Every 4xx/5xx: ``field`` and ``rule`` name what broke (``field`` is ``""`` when the
    error is not about one field, e.g. a missing token)."""

    error: str
    field: str = ""
    rule: str = ""
    value: Any = None


class StatusView(BaseModel):
    """Pools, queue, sandboxes, services and providers at a glance (the CLI's ``status``)."""

    tenant: str
    queue: dict[str, int]
    pools: list[dict[str, Any]]
    sandboxes: dict[str, int]
    services: list[str]
    providers: list[str]
    num_envs: int
    num_pending_actions: int
    max_queued_actions: int


#: the error answers every route documents (all with ``ErrorBody``)
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 404, 409, 410, 422, 429, 503)
}
