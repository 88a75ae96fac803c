"""Core: policies by name, as chosen in configuration."""

from __future__ import annotations

from typing import Any

from arl_tangram.core.errors import SpecError
from arl_tangram.core.policies.base import Policy
from arl_tangram.core.policies.elastic import ElasticPolicy, FixedDopPolicy, IdealPolicy
from arl_tangram.core.policies.k8s_static import K8sStaticPolicy, TaskPoolPolicy

POLICIES: dict[str, type[Policy]] = {
    "elastic": ElasticPolicy,
    "k8s-static": K8sStaticPolicy,
    "task-pool": TaskPoolPolicy,
    "fixed-dop": FixedDopPolicy,
    "ideal": IdealPolicy,
}


def make_policy(name: str, **params: Any) -> Policy:
    """Build the policy named ``name`` with its parameters; unknown names raise ``SpecError``."""
    cls = POLICIES.get(name)
    if cls is None:
        raise SpecError("policy", f"must be one of {', '.join(sorted(POLICIES))}", name)
    return cls(**params)
