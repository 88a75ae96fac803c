"""Shell: env leases, the bookkeeping that lets the service reclaim envs nobody uses.

RL frameworks such as verl have no end-of-trajectory hook, so a forgotten env must not
hold its memory forever. Each env the controller created holds a lease: every action, file
or session call on it renews it, as does ``Controller.renew_env``. An env with an unfinished
action (running, or queued: its client is waiting on it) is in use: its lease is renewed
each sweep and again when the action ends, so it never expires under an action, and its
idle time counts from the end of its last one. An env idle for ``idle_ttl_s`` is due: the
controller's housekeeping releases it (sandbox destroyed, like a client's release) and keeps
an ``ExpiredEnv`` record of it; an action submitted to it later is ``rejected`` (no such env).

The table also answers the per-tenant questions admission asks (how many envs, how much
memory). Times are the controller's clock. Event-loop thread only (not thread-safe).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_EXPIRED_KEPT = 4096  # expiry records kept for lookups (oldest dropped first)


@dataclass
class Lease:
    env_id: str
    tenant: str
    mem_bytes: int
    last_used_s: float


@dataclass(frozen=True)
class ExpiredEnv:
    """An env the service released because its lease ran out."""

    env_id: str
    tenant: str
    idle_s: float  # how long it had been unused
    expired_s: float  # controller clock
    expired_wall_s: float  # seconds since the epoch, for people and the HTTP API

    @property
    def cause(self) -> str:
        return f"lease_expired: env {self.env_id} was unused for {self.idle_s:.1f} s (env_idle_ttl_s)"


class EnvLeases:
    """Leases by env id, with per-tenant counts of envs and memory kept up to date."""

    def __init__(self, idle_ttl_s: float) -> None:
        self.idle_ttl_s = idle_ttl_s
        self._leases: dict[str, Lease] = {}
        self._envs_of: Counter[str] = Counter()
        self._mem_of: Counter[str] = Counter()
        self.expired: OrderedDict[str, ExpiredEnv] = OrderedDict()

    def add(self, env_id: str, tenant: str, mem_bytes: int, now_s: float) -> None:
        self._leases[env_id] = Lease(env_id, tenant, mem_bytes, now_s)
        self._envs_of[tenant] += 1
        self._mem_of[tenant] += mem_bytes

    def get(self, env_id: str) -> Lease | None:
        return self._leases.get(env_id)

    def renew(self, env_id: str, now_s: float) -> bool:
        """Mark the env used now; False for an env without a lease (gone, or never made)."""
        lease = self._leases.get(env_id)
        if lease is None:
            return False
        lease.last_used_s = max(lease.last_used_s, now_s)
        return True

    def drop(self, env_id: str) -> Lease | None:
        """End an env's lease (released, failed or expired). Idempotent."""
        lease = self._leases.pop(env_id, None)
        if lease is not None:
            for counter, amount in ((self._envs_of, 1), (self._mem_of, lease.mem_bytes)):
                counter[lease.tenant] -= amount
                if counter[lease.tenant] <= 0:
                    del counter[lease.tenant]
        return lease

    def due(self, now_s: float, busy: Callable[[str], bool]) -> list[Lease]:
        """Leases idle for ``idle_ttl_s`` or longer, in env id order; a ``busy`` env (an
        unfinished action on it, or still being created) is renewed instead: its idle time
        then counts from the end of its last action, which renews it too."""
        expired = []
        for env_id, lease in self._leases.items():
            if now_s - lease.last_used_s < self.idle_ttl_s:
                continue
            if busy(env_id):
                lease.last_used_s = now_s
            else:
                expired.append(lease)
        return sorted(expired, key=lambda lease: lease.env_id)

    def note_expired(self, record: ExpiredEnv) -> None:
        self.expired[record.env_id] = record
        while len(self.expired) > MAX_EXPIRED_KEPT:
            self.expired.popitem(last=False)

    def envs_of(self, tenant: str) -> int:
        return self._envs_of.get(tenant, 0)

    def mem_bytes_of(self, tenant: str) -> int:
        return self._mem_of.get(tenant, 0)

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, env_id: str) -> bool:
        return env_id in self._leases
