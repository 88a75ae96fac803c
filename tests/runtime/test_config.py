"""The configuration file: TOML and YAML, embedded defaults, every rule's error naming the
field path, secrets kept out of errors, and the core's quota pools built from providers."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from arl_tangram.core.policies.elastic import ElasticPolicy
from arl_tangram.core.policies.k8s_static import K8sStaticPolicy
from arl_tangram.core.topology import QuotaPoolSpec
from arl_tangram.runtime.config import (
    ConfigError,
    ServiceSettings,
    TangramConfig,
    load_config,
    parse_config,
    parse_size_bytes,
    quota_pools,
)
from arl_tangram.runtime.embedded import cluster_spec

FULL = textwrap.dedent(
    """
    [scheduler]
    policy = "k8s-static"
    params = { pod_millicores = 2000 }

    [cpu]
    pool_size = 4
    mem_bytes = "2GiB"
    pids_max = 256
    workspace_bytes = "1GiB"
    tmp_bytes = 134217728

    [gpu]
    devices = 2
    device_mem_bytes = "4GiB"

    [[providers]]
    name = "search"
    base_url = "http://127.0.0.1:8001"
    keys = ["sk-a", "sk-b"]
    rps = 5
    tokens_per_min = 100000
    max_concurrency = 3

    [[providers]]
    name = "judge"
    base_url = "https://api.example.com/v1"
    keys_env = "JUDGE_KEYS"
    rps = 2.5
    auth_header = "x-api-key"
    auth_scheme = ""

    [[services]]
    name = "reward/minilm"
    folder = "/models/all-MiniLM-L6-v2"
    handler = "score"

    [[services]]
    name = "teacher"
    module = "my_models.teacher:build"
    handler = "logprobs"
    devices_min = 2
    devices_max = 8
    weight_bytes = "16GiB"
    """
)
ENV = {"JUDGE_KEYS": "jk-1, jk-2 jk-3"}


def test_no_file_gives_the_embedded_defaults() -> None:
    config = load_config(None)
    assert config == TangramConfig()
    assert (config.scheduler.policy, config.gpu.devices) == ("elastic", "auto")
    assert config.providers == () and config.services == () and quota_pools(config) == ()
    assert isinstance(config.scheduler.make_policy(), ElasticPolicy)
    assert parse_config("") == TangramConfig()


def test_full_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "tangram.toml"
    path.write_text(FULL)
    config = load_config(path, environ=ENV)
    assert config.source == str(path)
    assert isinstance(config.scheduler.make_policy(), K8sStaticPolicy)
    assert config.scheduler.params == {"pod_millicores": 2000}
    assert (config.cpu.pool_size, config.cpu.mem_bytes, config.cpu.tmp_bytes) == (4, 2 << 30, 128 << 20)
    assert (config.gpu.devices, config.gpu.device_mem_bytes) == (2, 4 << 30)
    search, judge = config.providers
    assert search.keys == ("sk-a", "sk-b") and search.rate_per_s == 5.0 and search.tokens_per_min == 100000
    assert judge.keys == ("jk-1", "jk-2", "jk-3") and judge.auth_value("jk-1") == "jk-1"
    assert judge.auth_header == "x-api-key" and judge.tokens_per_min is None
    minilm, teacher = config.services
    assert (minilm.folder, minilm.module, minilm.handler) == ("/models/all-MiniLM-L6-v2", None, "score")
    assert (teacher.devices_min, teacher.devices_max, teacher.weight_bytes) == (2, 8, 16 << 30)
    with pytest.raises(AttributeError):
        config.cpu.pool_size = 1  # type: ignore[misc]


def test_quota_pools_sum_the_keys_limits() -> None:
    config = parse_config(FULL, environ=ENV)
    assert quota_pools(config) == (
        QuotaPoolSpec("search", max_concurrency=6, rate_per_s=10.0),
        QuotaPoolSpec("judge", max_concurrency=24, rate_per_s=7.5),
    )


def test_yaml_file(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    path = tmp_path / "tangram.yaml"
    path.write_text(
        textwrap.dedent(
            """
            scheduler: {policy: fixed-dop, params: {dop: 2}}
            providers:
              - {name: search, base_url: "http://127.0.0.1:9", keys: [k1], rps: 3}
            """
        )
    )
    config = load_config(path)
    assert config.scheduler.policy == "fixed-dop"
    assert quota_pools(config) == (QuotaPoolSpec("search", max_concurrency=8, rate_per_s=3.0),)


PROVIDER = 'name = "p"\nbase_url = "http://127.0.0.1:9"\nkeys = ["k"]\n'


@pytest.mark.parametrize(
    ("text", "field", "rule"),
    [
        (f"[[providers]]\n{PROVIDER}\n[[providers]]\n{PROVIDER.replace('p', 'q', 1)}rps = 0\n", "providers[1].rps", "must be a finite number > 0"),
        (f"[[providers]]\n{PROVIDER}rps = nan\n", "providers[0].rps", "must be a finite number > 0"),
        (f"[[providers]]\n{PROVIDER}rps = true\n", "providers[0].rps", "must be a finite number > 0"),
        (f"[[providers]]\n{PROVIDER}tokens_per_min = 0\n", "providers[0].tokens_per_min", "must be an integer >= 1"),
        (f"[[providers]]\n{PROVIDER}max_concurrency = 1.5\n", "providers[0].max_concurrency", "must be an integer >= 1"),
        (f"[[providers]]\n{PROVIDER}burst = 0.5\n", "providers[0].burst", ">= 1"),
        (f"[[providers]]\n{PROVIDER}auth_scheme = 3\n", "providers[0].auth_scheme", "must be a string"),
        (f"[[providers]]\n{PROVIDER}ratelimit = 3\n", "providers[0].ratelimit", "is not a known key"),
        (f"[[providers]]\n{PROVIDER.replace('http://', 'ftp://')}", "providers[0].base_url", "http://"),
        (f"[[providers]]\n{PROVIDER}\n[[providers]]\n{PROVIDER}", "providers[1].name", "must be unique"),
        ('[[providers]]\nname = "p"\nbase_url = "http://x"\n', "providers[0].keys", "exactly one of keys or keys_env"),
        ('[[providers]]\nname = "p"\nbase_url = "http://x"\nkeys_env = "NOPE_UNSET"\n', "providers[0].keys_env", "environment variable that is set"),
        ('[[providers]]\nname = "p"\nbase_url = "http://x"\nkeys = []\n', "providers[0].keys", "non-empty list"),
        ('[[providers]]\nname = "bad name"\nbase_url = "http://x"\nkeys = ["k"]\n', "providers[0].name", "letters, digits"),
        ('[scheduler]\npolicy = "fastest"\n', "scheduler.policy", "must be one of elastic"),
        ('[scheduler]\npolicy = "elastic"\nparams = { depht = 3 }\n', "scheduler.params", "depht"),
        ('[scheduler]\nmode = "x"\n', "scheduler.mode", "is not a known key"),
        ("[cpu]\npool_size = -1\n", "cpu.pool_size", "must be an integer >= 0"),
        ('[cpu]\nmem_bytes = "2 gigs"\n', "cpu.mem_bytes", "size such as"),
        ('[cpu]\nmem_bytes = "1MiB"\n', "cpu.mem_bytes", ">= 16777216 bytes"),
        ("[cpu]\npids_max = 2\n", "cpu.pids_max", "must be an integer >= 8"),
        ("[cpu]\nkill_grace_s = 0\n", "cpu.kill_grace_s", "in (0, 60]"),
        ("[gpu]\ndevices = 3\n", "gpu.devices", '"auto" or a count'),
        ('[gpu]\ndevices = "cuda"\n', "gpu.devices", '"auto" or a count'),
        ("[gpu]\nmem_fraction = 1.5\n", "gpu.mem_fraction", "in (0, 1]"),
        ('[[services]]\nname = "s"\nhandler = "score"\n', "services[0].folder", "exactly one of folder or module"),
        ('[[services]]\nname = "s"\nfolder = "/m"\nhandler = "chat"\n', "services[0].handler", "embed, score, logprobs"),
        ('[[services]]\nname = "s"\nmodule = "no_colon"\nhandler = "embed"\n', "services[0].module", "package.module:factory"),
        ('[[services]]\nname = "s"\nfolder = "/m"\nhandler = "embed"\ndevices_max = 3\n', "services[0].devices_max", "1, 2, 4 or 8"),
        ('[[services]]\nname = "s"\nfolder = "/m"\nhandler = "embed"\ndevices_min = 4\ndevices_max = 2\n', "services[0].devices_min", "<= devices_max"),
        ('[[services]]\nname = "s"\nfolder = "/m"\nhandler = "embed"\ngpus = 1\n', "services[0].gpus", "is not a known key"),
        ('[[services]]\nname = "s"\nfolder = "/m"\nhandler = "score"\nmax_batch = 4\n', "services[0].max_batch", "generate services only"),
        ('[[services]]\nname = "s"\nfolder = "/m"\nhandler = "generate"\nmax_batch = 0\n', "services[0].max_batch", ">= 1"),
        ('[[services]]\nname = "s"\nfolder = "/m"\nhandler = "generate"\nmax_context_tokens = 1\n', "services[0].max_context_tokens", ">= 2"),
        ('[network]\nport = 1\n', "network", "is not a known key"),
        ("cpu = 3\n", "cpu", "must be a table"),
        ("providers = 3\n", "providers", "array of tables"),
        ("[cpu\n", "<file>", "must be valid TOML"),
    ],
)
def test_bad_fields_are_named_with_their_rule(text: str, field: str, rule: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, environ={})
    assert info.value.field == field
    assert rule in info.value.rule
    assert str(info.value).startswith(f"{field}: ")


def test_errors_never_print_keys(tmp_path: Path) -> None:
    secret = "sk-live-NEVER-PRINT"
    for text in (
        f'[[providers]]\nname = "p"\nbase_url = "http://x"\nkeys = ["{secret}", ""]\n',
        f'[[providers]]\nname = "p"\nbase_url = "http://x"\nkeys = ["{secret}"]\nkeys_env = "K"\n',
        f'[[providers]]\nname = "p"\nbase_url = "http://x"\napi_keys = ["{secret}"]\n',
    ):
        with pytest.raises(ConfigError) as info:
            parse_config(text, environ={"K": secret})
        assert secret not in str(info.value)
    config = parse_config(f'[[providers]]\nname = "p"\nbase_url = "http://x"\nkeys = ["{secret}"]\n')
    assert secret not in repr(config)


def test_missing_file_and_yaml_syntax(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "absent.toml")
    assert info.value.field == "path"
    pytest.importorskip("yaml")
    bad = tmp_path / "bad.yml"
    bad.write_text("providers: [unclosed\n")
    with pytest.raises(ConfigError, match="must be valid YAML"):
        load_config(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a table"):
        load_config(listing)


def test_sizes() -> None:
    assert parse_size_bytes("512MiB", "x") == 512 << 20
    assert parse_size_bytes("1.5GiB", "x") == 3 << 29
    assert parse_size_bytes("2GB", "x") == 2 * 10**9
    assert parse_size_bytes("4096", "x") == 4096
    assert parse_size_bytes(4096, "x") == 4096
    for bad in (0, -1, True, "0B", "many"):
        with pytest.raises(ConfigError):
            parse_size_bytes(bad, "x")


SERVICE = textwrap.dedent(
    """
    [service]
    journal_path = "/var/lib/arl-tangram/journal.sqlite"
    env_idle_ttl_s = 120
    result_retention_s = 0.5
    max_queued_actions = 64

    [tenants.team-a]
    token = "tok-a"
    weight = 2.5
    max_envs = 8
    max_concurrent_actions = 100
    max_mem_bytes = "16GiB"

    [tenants.team-b]
    token_env = "TEAM_B_TOKEN"

    [tenants.local]
    max_envs = 2
    """
)


def test_service_and_tenants() -> None:
    config = parse_config(SERVICE, environ={"TEAM_B_TOKEN": " tok-b "})
    service = config.service
    assert (service.journal_path, service.env_idle_ttl_s, service.result_retention_s) == ("/var/lib/arl-tangram/journal.sqlite", 120.0, 0.5)
    assert service.max_queued_actions == 64
    a, b, local = config.tenants["team-a"], config.tenants["team-b"], config.tenants["local"]
    assert (a.token, a.weight, a.max_envs, a.max_concurrent_actions, a.max_mem_bytes) == ("tok-a", 2.5, 8, 100, 16 << 30)
    assert (b.token, b.weight, b.max_envs, b.max_mem_bytes) == ("tok-b", 1.0, None, None)
    assert (local.token, local.max_envs) == (None, 2)
    assert "tok-a" not in repr(config) and "tok-b" not in repr(config)
    defaults = TangramConfig()
    assert defaults.service == ServiceSettings() and defaults.service.journal_path is None and dict(defaults.tenants) == {}
    assert (ServiceSettings.env_idle_ttl_s, ServiceSettings.result_retention_s, ServiceSettings.max_queued_actions) == (600, 3600, 10000)


def test_tenant_weights_reach_the_core() -> None:
    spec = cluster_spec(parse_config(SERVICE, environ={"TEAM_B_TOKEN": "tok-b"}))
    weights = getattr(spec, "tenant_weights", None)
    if weights is None:
        pytest.skip("the core has no tenant weights yet")
    assert dict(weights) == {"local": 1.0, "team-a": 2.5, "team-b": 1.0}


@pytest.mark.parametrize(
    ("text", "field", "rule"),
    [
        ("[service]\nenv_idle_ttl_s = 0\n", "service.env_idle_ttl_s", "must be a finite number > 0"),
        ("[service]\nresult_retention_s = -1\n", "service.result_retention_s", "> 0"),
        ("[service]\nmax_queued_actions = 0\n", "service.max_queued_actions", "must be an integer >= 1"),
        ('[service]\njournal_path = ""\n', "service.journal_path", "non-empty path"),
        ("[service]\nleases = 1\n", "service.leases", "is not a known key"),
        ("[tenants.a]\nweight = 0\n", "tenants.a.weight", "must be a finite number > 0"),
        ("[tenants.a]\nmax_envs = 0\n", "tenants.a.max_envs", "must be an integer >= 1"),
        ("[tenants.a]\nmax_concurrent_actions = 1.5\n", "tenants.a.max_concurrent_actions", "integer >= 1"),
        ('[tenants.a]\nmax_mem_bytes = "lots"\n', "tenants.a.max_mem_bytes", "size such as"),
        ('[tenants.a]\ntoken = "x"\ntoken_env = "T"\n', "tenants.a.token", "at most one of token or token_env"),
        ('[tenants.a]\ntoken_env = "UNSET_TOKEN_VAR"\n', "tenants.a.token_env", "that is set"),
        ('[tenants.a]\ntoken = ""\n', "tenants.a.token", "non-empty string"),
        ('[tenants.a]\ntoken = "same"\n[tenants.b]\ntoken = "same"\n', "tenants.b.token", "unique across tenants"),
        ('[tenants."bad name"]\nweight = 1\n', 'tenants.bad name', "letters, digits"),
        ("[tenants]\na = 3\n", "tenants.a", "must be a table"),
    ],
)
def test_bad_service_and_tenant_fields_are_named(text: str, field: str, rule: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, environ={})
    assert info.value.field == field and rule in info.value.rule


def test_tenant_errors_never_print_tokens() -> None:
    secret = "tok-NEVER-PRINT"
    for text in (
        f'[tenants.a]\ntoken = "{secret}"\n[tenants.b]\ntoken = "{secret}"\n',
        f'[tenants.a]\ntokn = "{secret}"\n',
        f'[tenants.a]\npassword = "{secret}"\n',
    ):
        with pytest.raises(ConfigError) as info:
            parse_config(text, environ={})
        assert secret not in str(info.value)


def test_a_generate_service_takes_its_kv_cache_sizing() -> None:
    text = '[[services]]\nname = "judge/x"\nfolder = "/m"\nhandler = "generate"\nmax_batch = 8\nmax_context_tokens = 1024\n'
    service = parse_config(text, environ={}).services[0]
    assert (service.handler, service.max_batch, service.max_context_tokens) == ("generate", 8, 1024)
    plain = parse_config('[[services]]\nname = "s"\nfolder = "/m"\nhandler = "generate"\n', environ={}).services[0]
    assert (plain.max_batch, plain.max_context_tokens) == (None, None)


def test_image_aliases_map_references_and_bad_ones_are_named() -> None:
    public = "docker.io/swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    config = parse_config(f'[images]\nstore_path = "/s"\naliases = {{"{public}" = "127.0.0.1:5000/swe/calc:v1"}}\n', environ={})
    assert config.images is not None and dict(config.images.aliases) == {public: "127.0.0.1:5000/swe/calc:v1"}
    for text in (f'aliases = {{"{public}" = "Bad Ref"}}', 'aliases = {"Bad Key" = "x:1"}', f'aliases = {{"{public}" = 3}}'):
        with pytest.raises(ConfigError) as info:
            parse_config(f'[images]\nstore_path = "/s"\n{text}\n', environ={})
        assert info.value.field.startswith("images.aliases.") and "image reference" in info.value.rule


def test_sandboxfusion_language_images_are_read_and_bad_ones_named() -> None:
    from arl_tangram.api.compat.languages import LANGUAGES
    from arl_tangram.runtime.config_sandboxfusion import LANGUAGE_NAMES

    assert set(LANGUAGE_NAMES) == {lang.name for lang in LANGUAGES}  # the config's names are the face's
    config = parse_config('[sandboxfusion]\nlanguage_images = { go = "127.0.0.1:5000/sf/langs:1" }\n', environ={})
    assert dict(config.sandboxfusion.language_images) == {"go": "127.0.0.1:5000/sf/langs:1"}
    for text, field, rule in (
        ('language_images = { cobol = "x:1" }', "sandboxfusion.language_images.cobol", "must be one of python"),
        ('language_images = { go = "Bad Ref" }', "sandboxfusion.language_images.go", "must be"),
        ('images = { go = "x:1" }', "sandboxfusion.images", "is not a known key"),
    ):
        with pytest.raises(ConfigError) as info:
            parse_config(f"[sandboxfusion]\n{text}\n", environ={})
        assert info.value.field == field and rule in info.value.rule


def test_sandboxfusion_pool_size_is_read_and_reaches_the_face() -> None:
    from fastapi import FastAPI

    from arl_tangram.api.compat import mount_compat

    config = parse_config("[sandboxfusion]\nmax_envs = 40\nmax_idle = 12\n", environ={})
    assert (config.sandboxfusion.max_envs, config.sandboxfusion.max_idle) == (40, 12)
    app = FastAPI()
    mount_compat(app, config=config)
    assert (app.state.compat_settings.max_envs, app.state.compat_settings.max_idle) == (40, 12)
    for text, field in (("max_envs = 0", "sandboxfusion.max_envs"), ("max_idle = -1", "sandboxfusion.max_idle")):
        with pytest.raises(ConfigError) as info:
            parse_config(f"[sandboxfusion]\n{text}\n", environ={})
        assert info.value.field == field and "integer >= 1" in info.value.rule


def test_sandboxfusion_warm_envs_is_read_bounded_by_max_idle_and_reaches_the_face() -> None:
    from fastapi import FastAPI

    from arl_tangram.api.compat import mount_compat

    config = parse_config("[sandboxfusion]\nmax_idle = 12\nwarm_envs = 12\n", environ={})
    assert config.sandboxfusion.warm_envs == 12
    app = FastAPI()
    mount_compat(app, config=config)
    assert app.state.compat_settings.warm_envs == 12
    assert parse_config("", environ={}).sandboxfusion.warm_envs == 0
    for text, rule in (("warm_envs = -1", "integer >= 0"), ("max_idle = 12\nwarm_envs = 13", "at most max_idle (12)")):
        with pytest.raises(ConfigError) as info:
            parse_config(f"[sandboxfusion]\n{text}\n", environ={})
        assert info.value.field == "sandboxfusion.warm_envs" and rule in info.value.rule
    with pytest.raises(ConfigError) as info:
        mount_compat(FastAPI(), max_idle=2, warm_envs=3)
    assert info.value.field == "warm_envs" and "from 0 to max_idle (2)" in info.value.rule
