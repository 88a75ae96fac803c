"""Shell: the wire format of the native ``/v1`` API, as pydantic models (they are the OpenAPI schema).

Each model validates shape and ranges only; the rules that need the live system (does this
env exist, does this memory fit a node) are checked by the handlers, and the core's own
``SpecError`` s name their field too. Ids the client chooses are restricted to what a
sandbox id may hold, so an internal, tenant-scoped id is always a valid sandbox id.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

#: client-chosen ids: the tenant prefix and a dot are added internally, within 64 characters
ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,46}$"
SIZE_PATTERN = r"^\s*0*[1-9]\d*(\.\d+)?\s*([KMGTkmgt]i?[Bb]|[Bb])?\s*$"  # >= 1 unit
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,127}$"

ExternalId = Annotated[str, Field(pattern=ID_PATTERN)]
def _integral(value: Any) -> Any:
    """JSON Schema's integers include 4.0; strict pydantic's do not: take the integral floats."""
    return int(value) if isinstance(value, float) and value.is_integer() and abs(value) < 2**63 else value


#: an integer as JSON Schema means it (strict otherwise: "4" and true are refused); where
#: it carries bounds of its own, the ``Field`` goes before the validator (else the schema
#: shows pydantic's "ge" instead of "minimum")
JsonInt = Annotated[int, BeforeValidator(_integral)]
Size = Annotated[int, Field(ge=1), BeforeValidator(_integral)] | Annotated[str, Field(pattern=SIZE_PATTERN, max_length=32)]
# sizes with the CPU manager's minimums in the schema: >= 1 MiB (workspace, tmp), >= 16 MiB (memory)
_NUM = r"0*[1-9]\d*(?:\.\d+)?\s*"
_BIG_UNIT = r"(?:[GgTt]i?[Bb])"
MIB_SIZE_PATTERN = rf"^\s*(?:{_NUM}(?:[Mm]i[Bb]|{_BIG_UNIT})|0*[1-9]\d+(?:\.\d+)?\s*[Mm][Bb])\s*$"
_AT_LEAST_16 = r"0*(?:1[6-9]|[2-9]\d|[1-9]\d{2,})(?:\.\d+)?\s*"
_AT_LEAST_17 = r"0*(?:1[7-9]|[2-9]\d|[1-9]\d{2,})(?:\.\d+)?\s*"
MEM_SIZE_PATTERN = rf"^\s*(?:{_AT_LEAST_16}[Mm]i[Bb]|{_AT_LEAST_17}[Mm][Bb]|{_NUM}{_BIG_UNIT})\s*$"
MibSize = Annotated[int, Field(ge=1 << 20), BeforeValidator(_integral)] | Annotated[str, Field(pattern=MIB_SIZE_PATTERN, max_length=32)]
MemSize = Annotated[int, Field(ge=16 << 20), BeforeValidator(_integral)] | Annotated[str, Field(pattern=MEM_SIZE_PATTERN, max_length=32)]
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"

#: Rules between fields that JSON Schema cannot state; the schema lists them under
#: ``info.x-cross-field-rules`` ("<field>: <rule>", as a 422 names them) and the fuzz accepts
#: a 422 for a schema-valid request only when it names one of these.
CROSS_FIELD_RULES = (
    "cpu.min: must be <= cpu.max",
    "devices_min: must be <= devices_max",
    "folder: exactly one of folder or module must be set",
    "max_batch: applies to generate services only",
    "max_context_tokens: applies to generate services only",
    # a sandbox path's rule depends on the env's root (files.sandbox_path): a host-root env
    # takes /workspace and /tmp only, an image env anything but the kernel's directories
    "path: must stay inside /workspace or /tmp", "cwd: must stay inside /workspace or /tmp",
    "path: must not be under /proc, /sys or /dev", "cwd: must not be under /proc, /sys or /dev",
    "reference: must be given (or path, to import a file on the server)",  # POST /v1/images: one of the two
    "count: must be an integer in [1, max_fork_count]",  # POST /v1/envs/{id}/fork: the server's [images] bound
)  # fmt: skip


def _not_both(a: str, a_type: str, b: str, b_type: str) -> dict[str, Any]:
    """JSON Schema for "not both ``a`` (of ``a_type``) and ``b`` (of ``b_type``)"."""
    return {"not": {"required": [a, b], "properties": {a: {"type": a_type}, b: {"type": b_type}}}}


class _Strict(BaseModel):
    # strict: a field takes its own JSON type only (no "1" for 1, no 0 for false), which is
    # what the schema says; unknown fields are refused
    model_config = ConfigDict(extra="forbid", strict=True)


# -- envs ----------------------------------------------------------------------------------
class EnvCreate(_Strict):
    """A stateful sandbox: memory held for its life, zero CPU while idle."""

    env_id: ExternalId | None = Field(None, description="client-chosen id; a uuid4-based one when absent")
    image: str = Field(
        "host", min_length=1, max_length=512,
        description="'host' or 'python' (the host's read-only root), an image reference HOST[:PORT]/name[:tag], or an image id sha256:...",
    )  # fmt: skip
    memory: MemSize = "1GiB"
    pids_max: JsonInt = Field(512, ge=8, le=65536)
    workspace: MibSize = "512MiB"
    tmp: MibSize = "256MiB"
    writable: MibSize = Field("1GiB", description="cap of an image env's writable layer")
    trajectory_id: str = Field("", max_length=128)
    snapshot: str | None = Field(
        None, pattern=r"^snap-[a-z0-9]{6,40}$", description="start from this snapshot's filesystem (its image and node; image is then ignored)",
    )  # fmt: skip


class EnvView(BaseModel):
    env_id: str
    image: str = "host"
    mem_bytes: int
    trajectory_id: str = ""
    ready: bool = False
    num_running: int = 0


class EnvList(BaseModel):
    envs: list[EnvView]


# A path in a sandbox: relative to its working directory, or absolute (where it may point
# depends on the env's root: see CROSS_FIELD_RULES); no ".." component, components of 1-255
# bytes without NUL (the rule files.sandbox_path and the kernel apply, in the schema).
# Written without lookarounds so every regex engine takes it.
_SEGMENT = r"(?:[^/.\x00][^/\x00]{0,254}|\.[^/.\x00][^/\x00]{0,253}|\.\.[^/\x00]{1,253}|\.)"
SANDBOX_PATH_PATTERN = rf"^(?:/|/?{_SEGMENT}(?:/{_SEGMENT})*/?)$"
# environment variables: the rule validate_env applies, in the schema (JSON Schema's own
# words for "every key"; pydantic would write patternProperties, which lets other keys by)
def _env_rule(env: dict[str, str]) -> dict[str, str]:
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise ValueError(f"names must be non-empty, without '=' or NUL (got {key[:64]!r})")
        if "\0" in value:
            raise ValueError(f"values must be without NUL (the value of {key[:64]!r})")
    return env


EnvVars = Annotated[
    dict[str, str],
    AfterValidator(_env_rule),
    WithJsonSchema({
        "type": "object", "propertyNames": {"minLength": 1, "pattern": "^[^=\\x00]+$"},
        "additionalProperties": {"type": "string", "pattern": "^[^\\x00]*$"},
    }),
]  # fmt: skip
SandboxPath = Annotated[str, Field(min_length=1, max_length=4096, pattern=SANDBOX_PATH_PATTERN)]


class SessionCreate(_Strict):
    env: EnvVars | None = None
    cwd: SandboxPath | None = None


class SessionView(BaseModel):
    session_id: str


# -- actions -------------------------------------------------------------------------------
class Elasticity(_Strict):
    """The action's DoP range on its key resource and, optionally, its curve (an Amdahl
    ``serial_fraction`` or a ``table`` of efficiencies, not both); without one the kind's
    learned curve. ``min`` must be <= ``max``."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_not_both("serial_fraction", "number", "table", "array"))

    min: JsonInt = Field(1, ge=1, le=1024)
    max: JsonInt = Field(1, ge=1, le=1024)
    serial_fraction: float | None = Field(None, ge=0.0, le=1.0)
    table: list[Annotated[float, Field(gt=0.0, le=1.0)]] | None = Field(None, min_length=1, max_length=1024)


_DEADLINE_DOC = (
    "seconds after submission by which the caller needs the result; one that can no longer start "
    "in time (its timeout_s counted) ends rejected, cause 'deadline: ...' (retryable)"
)
_MEMORY_DOC = (
    "the run's memory demand above its env's idle footprint (bytes or '3GiB'); at most the env's "
    "memory limit; absent: learned per kind, else the env's limit"
)


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
    """A ``bash -c`` string or an argv in an env's sandbox (or one of its sessions: then a
    string); ``stdin`` or ``stdin_b64``, not both."""

    model_config = ConfigDict(
        extra="forbid", strict=True,
        json_schema_extra={"allOf": [_not_both("stdin", "string", "stdin_b64", "string"), _not_both("session_id", "string", "command", "array")]},
    )  # fmt: skip

    type: Literal["exec"]
    env_id: ExternalId
    command: Annotated[str, Field(min_length=1, max_length=1 << 20)] | Annotated[list[str], Field(min_length=1, max_length=4096)]
    stdin: str | None = Field(None, max_length=16 << 20)
    stdin_b64: str | None = Field(None, max_length=22 << 20, pattern=BASE64_PATTERN)
    env: EnvVars | None = None
    cwd: str | None = Field(None, max_length=4096)
    session_id: str | None = Field(None, max_length=128)
    cpu: Elasticity = Field(default_factory=lambda: Elasticity.model_validate({}))
    t_ori_s: float | None = Field(None, gt=0.0, le=86400.0)
    memory: Size | None = Field(None, description=_MEMORY_DOC)
    deadline_s: float | None = Field(None, gt=0.0, le=86400.0, allow_inf_nan=False, description=_DEADLINE_DOC)


class CodeAction(_ActionBase):
    """Source code run by an interpreter in an env's sandbox (the code is its stdin)."""

    type: Literal["code"]
    env_id: ExternalId
    code: str = Field(max_length=16 << 20)
    language: Literal["python", "bash"] = "python"
    cpu: Elasticity = Field(default_factory=lambda: Elasticity.model_validate({}))
    t_ori_s: float | None = Field(None, gt=0.0, le=86400.0)
    memory: Size | None = Field(None, description=_MEMORY_DOC)
    deadline_s: float | None = Field(None, gt=0.0, le=86400.0, allow_inf_nan=False, description=_DEADLINE_DOC)


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
    tokens: Annotated[int, Field(ge=0), BeforeValidator(_integral)] | None = None

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
    max_batch: Annotated[int, Field(ge=1, le=1024), BeforeValidator(_integral)] | None = None  # generate: sequences decoded together
    max_context_tokens: Annotated[int, Field(ge=2), BeforeValidator(_integral)] | None = None  # generate: prompt + new tokens


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
    memory: dict[str, Any] = Field(
        default_factory=dict,
        description="memory per action: footprint_bytes, granted_bytes, used_bytes, paused_actions, pause_s, "
        "learned_peak_bytes per kind",
    )


#: the error answers every route documents (all with ``ErrorBody``)
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (401, 404, 409, 410, 413, 422, 429, 503)
}
