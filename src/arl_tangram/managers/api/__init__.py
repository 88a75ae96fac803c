"""Shell: the API-quota manager (providers, key pools, per-key token buckets and
concurrency caps, 429/Retry-After-aware retries, outbound HTTP through httpx)."""

from arl_tangram.managers.api.config import ProviderConfig
from arl_tangram.managers.api.manager import ApiManager
from arl_tangram.managers.api.results import OUTCOMES, ApiRequest, ApiResult

__all__ = ["OUTCOMES", "ApiManager", "ApiRequest", "ApiResult", "ProviderConfig"]
