"""The API-quota manager's accounting with time passed in: token buckets, Retry-After,
full-jitter backoff, the key pool's choice and the provider config's validation."""

from __future__ import annotations

import random
from email.utils import formatdate

import pytest

from arl_tangram.core.errors import SpecError
from arl_tangram.managers.api import ApiRequest, ApiResult, ProviderConfig
from arl_tangram.managers.api.bucket import TokenBucket, full_jitter_backoff_s, parse_retry_after
from arl_tangram.managers.api.keys import KeyPool
from arl_tangram.managers.api.provider import usage_tokens

SECRET = "sk-test-SECRET-0123456789"


def make_config(**overrides: object) -> ProviderConfig:
    settings: dict[str, object] = {"name": "llm", "base_url": "http://127.0.0.1:9", "keys": (SECRET,)}
    settings.update(overrides)
    return ProviderConfig(**settings)  # type: ignore[arg-type]


def test_bucket_paces_and_allows_debt() -> None:
    bucket = TokenBucket(capacity=2, refill_per_s=4, now=0.0)
    assert bucket.wait_s(1, now=0.0) == 0.0
    bucket.take(2, now=0.0)
    assert bucket.wait_s(1, now=0.0) == pytest.approx(0.25)
    assert bucket.wait_s(1, now=0.25) == 0.0
    bucket.take(5, now=0.25)  # charged late: a debt that later callers wait out
    assert bucket.level(0.25) == pytest.approx(-4.0)
    assert bucket.wait_s(1, now=0.25) == pytest.approx(1.25)
    bucket.give(100, now=0.25)
    assert bucket.level(0.25) == 2.0  # never above capacity
    assert bucket.wait_s(10, now=0.25) == 0.0  # asks beyond capacity wait for a full bucket only


def test_retry_after_seconds_date_and_garbage() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("3", now) == 3.0
    assert parse_retry_after(" 0.25 ", now) == 0.25
    assert parse_retry_after(formatdate(now + 7, usegmt=True), now) == pytest.approx(7, abs=1)
    assert parse_retry_after(formatdate(now - 60, usegmt=True), now) == 0.0
    assert parse_retry_after("-5", now) == 0.0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after("nan", now) is None
    assert parse_retry_after(None, now) is None


def test_full_jitter_backoff_is_bounded_capped_and_seeded() -> None:
    rng = random.Random(7)
    draws = [full_jitter_backoff_s(attempt, 0.5, 4.0, rng) for attempt in range(10) for _ in range(50)]
    assert all(0.0 <= d <= 4.0 for d in draws)
    assert max(full_jitter_backoff_s(0, 0.5, 4.0, rng) for _ in range(200)) <= 0.5
    assert max(full_jitter_backoff_s(100, 0.5, 4.0, rng) for _ in range(200)) > 2.0  # capped, not tiny
    again = random.Random(7)
    assert draws[:5] == [full_jitter_backoff_s(0, 0.5, 4.0, again) for _ in range(5)]


def test_key_pool_spreads_and_respects_blocks_and_slots() -> None:
    pool = KeyPool(make_config(keys=("a", "b", "c"), rate_per_s=1, max_concurrency=1), now=0.0)
    picked = []
    for _ in range(3):
        key, wait_s = pool.pick(None, now=0.0)
        assert key is not None and wait_s == 0.0
        picked.append(key.label)
        pool.reserve(key, None, now=0.0)
    assert picked == ["key0", "key1", "key2"]
    key, wait_s = pool.pick(None, now=0.0)
    assert key is None and wait_s == float("inf")  # every slot taken: only a release helps
    grant = pool.reserve(pool.keys[0], None, now=0.0)  # a second slot, for the check below
    assert pool.release(grant, 0, None, now=0.0) == 0
    assert pool.release(grant, 0, None, now=0.0) == 0  # idempotent
    assert pool.keys[0].in_flight == 1


def test_key_pool_charges_usage_and_learns_estimate() -> None:
    pool = KeyPool(make_config(tokens_per_min=600, rate_per_s=100, burst=100), now=0.0)
    key = pool.keys[0]
    grant = pool.reserve(key, None, now=0.0)
    assert grant.reserved_tokens == 1
    assert pool.release(grant, 250, None, now=0.0, learn=True) == 250
    assert key.tokens is not None and key.tokens.level(0.0) == 350
    assert pool.need_tokens(key, None) == 250  # the first answer sets the estimate
    grant = pool.reserve(key, 300, now=0.0)  # declared: reserved up front
    assert key.tokens.level(0.0) == 50
    assert pool.release(grant, None, 300, now=0.0) == 300  # no usage: the declaration is charged
    assert pool.need_tokens(key, 10_000) == 600  # never more than a full minute's budget
    _, wait_s = pool.pick(500, now=0.0)
    assert wait_s == pytest.approx(45.0)  # 450 tokens at 10 per second


def test_usage_tokens_shapes() -> None:
    assert usage_tokens({"usage": {"total_tokens": 12}}) == 12
    assert usage_tokens({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}) == 7
    assert usage_tokens({"usage": {"total_tokens": "12"}}) is None
    assert usage_tokens({"choices": []}) is None
    assert usage_tokens("text") is None


@pytest.mark.parametrize(
    ("overrides", "field", "rule"),
    [
        ({"rate_per_s": 0}, "providers[llm].rate_per_s", "finite number > 0"),
        ({"rate_per_s": float("inf")}, "providers[llm].rate_per_s", "finite number > 0"),
        ({"max_concurrency": 0}, "providers[llm].max_concurrency", "integer >= 1"),
        ({"tokens_per_min": 2.5}, "providers[llm].tokens_per_min", "integer >= 1"),
        ({"burst": 0.5}, "providers[llm].burst", ">= 1"),
        ({"base_url": "ftp://x"}, "providers[llm].base_url", "http://"),
        ({"keys": ()}, "providers[llm].keys", "non-empty list"),
        ({"keys": ("",)}, "providers[llm].keys", "non-empty list"),
        ({"max_retries": -1}, "providers[llm].max_retries", "integer >= 0"),
        ({"auth_header": " "}, "providers[llm].auth_header", "header name"),
    ],
)
def test_provider_config_errors_name_field_and_rule(overrides: dict[str, object], field: str, rule: str) -> None:
    with pytest.raises(SpecError) as info:
        make_config(**overrides)
    assert info.value.field == field
    assert rule in info.value.rule


def test_config_and_request_hide_secrets_and_validate() -> None:
    config = make_config()
    assert SECRET not in repr(config)
    assert config.auth_value(SECRET) == f"Bearer {SECRET}"
    assert make_config(auth_scheme="").auth_value(SECRET) == SECRET
    with pytest.raises(SpecError) as info:
        make_config(keys=(SECRET, ""))
    assert SECRET not in str(info.value)
    with pytest.raises(SpecError, match="request.path"):
        ApiRequest(path="http://elsewhere/x")
    with pytest.raises(SpecError, match="request.method"):
        ApiRequest(method="FETCH")
    assert ApiRequest(method="get", path="/v1/models").method == "GET"
    with pytest.raises(ValueError):
        ApiResult(outcome="done")
