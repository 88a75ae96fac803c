"""Shell: the one controller loop, written once for the simulator, the tests and the live system.

It owns the cluster state and drives ``Scheduler.step``: drain the pending events, step,
hand the decisions to an executor, arm the wake-up the policy asked for. It is written
against three seams:

- a ``Clock`` (wall time live, virtual time in the simulator and the twin test);
- an ``Executor`` that carries decisions out (the live node agents, the simulated managers,
  a test harness), with one handler per decision kind;
- an event sink: ``ControllerLoop.post``, through which executors and clients report events.

The loop does no I/O and never blocks; it is not thread-safe (its driver calls it from one
thread: the simulator's event loop, or the live controller's asyncio task). This module
imports only ``core`` so the simulator can use it without managers or torch.
"""

from __future__ import annotations

import abc
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from arl_tangram.core.decisions import (
    CancelAction,
    Decision,
    EvictService,
    GrowMemory,
    LoadService,
    OomKill,
    PlaceEnv,
    PreemptAction,
    PullImage,
    RejectAction,
    ReleaseEnv,
    RetryAction,
    StartAction,
)
from arl_tangram.core.events import Event
from arl_tangram.core.invariants import validate
from arl_tangram.core.scheduler import Scheduler
from arl_tangram.core.state import ClusterState

MAX_REMEMBERED_WAKES = 1024  # wake times already armed, kept so a repeated one arms once


class Clock(Protocol):
    def now(self) -> float: ...


class ManualClock:
    """A virtual clock its driver sets (tests, the twin run); the simulator reads its queue."""

    def __init__(self, now_s: float = 0.0) -> None:
        self.now_s = now_s

    def now(self) -> float:
        return self.now_s


class Executor(abc.ABC):
    """Carries decisions out; one handler per decision kind, dispatched here once.

    Handlers must not block (start the work and return); they report what happens through
    the loop's sink, repeating the decision's ``stimulus_id`` on the events they post.
    Contract: every ``StartAction`` is answered by exactly one ``ActionFinished`` (repeating
    its ``attempt``) unless a later ``RejectAction`` or ``RetryAction`` for it (a lost node)
    ended that attempt; every ``PlaceEnv`` by ``EnvReady`` or ``EnvFailed``; every
    ``LoadService`` by ``ServiceReady`` or ``ReplicaFailed``; every ``PullImage`` by
    ``ImagePulled`` or ``ImagePullFailed``.
    """

    def apply(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            self._handlers[type(d)](self, d)

    @abc.abstractmethod
    def start_action(self, d: StartAction) -> None: ...

    @abc.abstractmethod
    def place_env(self, d: PlaceEnv) -> None: ...

    @abc.abstractmethod
    def release_env(self, d: ReleaseEnv) -> None: ...

    @abc.abstractmethod
    def load_service(self, d: LoadService) -> None: ...

    @abc.abstractmethod
    def evict_service(self, d: EvictService) -> None: ...

    @abc.abstractmethod
    def reject_action(self, d: RejectAction) -> None: ...

    @abc.abstractmethod
    def cancel_action(self, d: CancelAction) -> None: ...

    def retry_action(self, d: RetryAction) -> None:
        """Only an executor whose nodes can be lost sees this (the live one overrides it);
        any other raising here is a bug worth seeing, not an order to ignore."""
        raise NotImplementedError(f"{type(self).__name__} cannot retry {d.action_id}: it loses no nodes")

    def preempt_action(self, d: PreemptAction) -> None:
        """Demote a running action (``core.preemption``). The live executor lowers its CPU
        priority and the simulator runs it on idle cores only (``sim.demoted``); one that
        can do neither lets it run on as it was, which overstates the capacity it frees."""
        return None

    def pull_image(self, d: PullImage) -> None:
        """Only an executor with image stores sees this (the live one overrides it); the
        core orders pulls only for envs on images, which no other executor is given."""
        raise NotImplementedError(f"{type(self).__name__} cannot pull {d.image}: it has no image store")

    def grow_memory(self, d: GrowMemory) -> None:
        """Only an executor whose managers pause actions at their memory limit (the live
        one) sees this: the core grows a grant only after an ``ActionMemoryPaused``."""
        raise NotImplementedError(f"{type(self).__name__} cannot grow {d.action_id}'s memory: it reports no pauses")

    def oom_kill(self, d: OomKill) -> None:
        """As ``grow_memory``: the core orders it only for an action reported paused."""
        raise NotImplementedError(f"{type(self).__name__} cannot OOM-kill {d.action_id}: it reports no pauses")

    _handlers: dict[type, Callable[[Executor, Decision], None]] = {
        StartAction: lambda ex, d: ex.start_action(d),  # type: ignore[arg-type]
        PlaceEnv: lambda ex, d: ex.place_env(d),  # type: ignore[arg-type]
        ReleaseEnv: lambda ex, d: ex.release_env(d),  # type: ignore[arg-type]
        LoadService: lambda ex, d: ex.load_service(d),  # type: ignore[arg-type]
        EvictService: lambda ex, d: ex.evict_service(d),  # type: ignore[arg-type]
        RejectAction: lambda ex, d: ex.reject_action(d),  # type: ignore[arg-type]
        CancelAction: lambda ex, d: ex.cancel_action(d),  # type: ignore[arg-type]
        RetryAction: lambda ex, d: ex.retry_action(d),  # type: ignore[arg-type]
        PullImage: lambda ex, d: ex.pull_image(d),  # type: ignore[arg-type]
        PreemptAction: lambda ex, d: ex.preempt_action(d),  # type: ignore[arg-type]
        GrowMemory: lambda ex, d: ex.grow_memory(d),  # type: ignore[arg-type]
        OomKill: lambda ex, d: ex.oom_kill(d),  # type: ignore[arg-type]
    }


@dataclass(frozen=True)
class Round:
    """One entry of the decision log: what came in, what was decided, when."""

    now_s: float
    events: tuple[Event, ...]
    decisions: tuple[Decision, ...]
    wake_at: float | None = None


class ControllerLoop:
    """The controller loop. ``post`` events, then ``run_round`` whenever ``due()``.

    ``on_wake`` is called with each newly armed wake-up time, so the driver can make sure
    a round runs then (a timer live, an entry in the simulator's event queue).
    ``check=True`` validates the state invariants after every round (tests, checked sims).
    ``log`` receives every round (the decision log); None keeps none.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        state: ClusterState,
        clock: Clock,
        *,
        check: bool = False,
        log: Callable[[Round], None] | None = None,
        on_wake: Callable[[float], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.state = state
        self.clock = clock
        self.check = check
        self.log = log
        self.on_wake = on_wake
        self.executor: Executor | None = None
        self.rounds = 0
        self._pending: list[Event] = []
        self._stimuli = 0
        self._wakes: list[float] = []  # armed wake-up times, a heap
        self._armed: set[float] = set()

    def attach(self, executor: Executor) -> None:
        self.executor = executor

    # -- the event sink ---------------------------------------------------------------
    def post(self, event: Event) -> str:
        """Queue ``event`` for the next round; give it a fresh stimulus id if it has none.
        Returns the id, which every decision it causes will repeat."""
        if not event.stimulus_id:
            self._stimuli += 1
            event = replace(event, stimulus_id=f"s{self._stimuli}")
        self._pending.append(event)
        return event.stimulus_id

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def wake_at(self) -> float | None:
        """The earliest armed wake-up, or None."""
        return self._wakes[0] if self._wakes else None

    def due(self) -> bool:
        """A round has work: events are pending, or an armed wake-up has come."""
        return bool(self._pending) or (bool(self._wakes) and self.clock.now() >= self._wakes[0])

    # -- rounds -----------------------------------------------------------------------
    def bootstrap(self) -> tuple[Decision, ...]:
        """Static placements before any event (dedicated deployments), carried out at once."""
        result = self.scheduler.bootstrap(self.state)
        return self._commit(result.state, (), result.decisions, None)

    def run_round(self) -> tuple[Decision, ...]:
        """Drain the pending events, step the scheduler, hand the decisions to the executor."""
        events, self._pending = tuple(self._pending), []
        now = self.clock.now()
        while self._wakes and self._wakes[0] <= now:
            heapq.heappop(self._wakes)
        result = self.scheduler.step(self.state, events, now)
        return self._commit(result.state, events, result.decisions, result.wake_at)

    def _commit(
        self, state: ClusterState, events: tuple[Event, ...], decisions: tuple[Decision, ...], wake_at: float | None
    ) -> tuple[Decision, ...]:
        self.state = state
        self.rounds += 1
        if self.check:
            validate(state)
        if self.log is not None:
            self.log(Round(state.now_s, events, decisions, wake_at))
        if self.executor is None:
            raise RuntimeError("ControllerLoop: attach an executor before running rounds")
        self.executor.apply(decisions)
        if wake_at is not None:
            self._arm(wake_at)
        return decisions

    def _arm(self, wake_at: float) -> None:
        # A policy may name the same deadline round after round; it is armed once.
        if wake_at in self._armed:
            return
        if len(self._armed) >= MAX_REMEMBERED_WAKES:
            now = self.clock.now()
            self._armed = {t for t in self._armed if t >= now}
        self._armed.add(wake_at)
        heapq.heappush(self._wakes, wake_at)
        if self.on_wake is not None:
            self.on_wake(wake_at)
