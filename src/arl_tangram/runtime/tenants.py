"""Shell: admission, the limits a submission or an env request must pass before anything
is queued: each tenant's configured limits and the service's bound on unfinished actions.

Who calls: ``Controller.submit`` and ``Controller.create_env``, synchronously, on the
event-loop thread; a refusal raises (``TenantLimitError`` or ``OverloadedError``) and
changes nothing. Counts come from the action store and the env lease table, which keep
them up to date in O(1). A tenant without a configuration is unlimited.
"""

from __future__ import annotations

from collections.abc import Mapping

from arl_tangram.runtime.actions import ActionStore
from arl_tangram.runtime.config import TenantConfig
from arl_tangram.runtime.errors import OverloadedError, TenantLimitError
from arl_tangram.runtime.leases import EnvLeases

RETRY_AFTER_MIN_S = 1.0  # the hint never asks a client to hammer the service
RETRY_AFTER_MAX_S = 30.0


class Admission:
    """Checks against ``tenants``' limits and ``max_queued_actions`` (the whole service)."""

    def __init__(self, tenants: Mapping[str, TenantConfig], max_queued_actions: int) -> None:
        self.tenants = tenants
        self.max_queued_actions = max_queued_actions
        self.completions_per_s = 0.0  # a running estimate, fed by the housekeeping sweep

    def check_action(self, tenant: str, store: ActionStore) -> None:
        """Raise if one more unfinished action would break a limit."""
        if store.num_unfinished >= self.max_queued_actions:
            raise OverloadedError(store.num_unfinished, self.max_queued_actions, self.retry_after_s(store))
        config = self.tenants.get(tenant)
        limit = config.max_concurrent_actions if config else None
        if limit is not None and store.unfinished_of(tenant) >= limit:
            raise TenantLimitError(
                tenant, "max_concurrent_actions", f"at most {limit} accepted and unfinished actions", store.unfinished_of(tenant) + 1
            )  # fmt: skip

    def check_env(self, tenant: str, mem_bytes: int, leases: EnvLeases) -> None:
        """Raise if one more env of ``mem_bytes`` would break the tenant's limits."""
        config = self.tenants.get(tenant)
        if config is None:
            return
        if config.max_envs is not None and leases.envs_of(tenant) >= config.max_envs:
            raise TenantLimitError(tenant, "max_envs", f"at most {config.max_envs} live envs", leases.envs_of(tenant) + 1)
        held = leases.mem_bytes_of(tenant)
        if config.max_mem_bytes is not None and held + mem_bytes > config.max_mem_bytes:
            raise TenantLimitError(
                tenant, "max_mem_bytes", f"the tenant's envs may hold at most {config.max_mem_bytes} bytes", held + mem_bytes
            )  # fmt: skip

    def retry_after_s(self, store: ActionStore) -> float:
        """How long until roughly a tenth of the backlog has drained, within bounds."""
        if self.completions_per_s <= 0:
            return RETRY_AFTER_MIN_S
        backlog = store.num_unfinished - self.max_queued_actions * 0.9
        return min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, backlog / self.completions_per_s))
