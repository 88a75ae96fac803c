"""Bench: schemathesis hooks of the service fuzz (loaded by ``SCHEMATHESIS_HOOKS``; never imported
by the server). One check: ``positive_data_acceptance`` as schemathesis has it, except that a
422 naming a rule listed in the schema's ``info.x-cross-field-rules`` is a documented
rejection (rules between fields JSON Schema cannot state, such as ``cpu.min <= cpu.max``)."""

from __future__ import annotations

import json
from typing import Any

import schemathesis

ACCEPTED = {401, 403, 404, 409, 429}


@schemathesis.check
def documented_positive_acceptance(ctx: Any, response: Any, case: Any) -> bool | None:
    """A schema-valid request is accepted (2xx/3xx) or refused by state, credentials or a
    documented cross-field rule; anything else is a rule the schema does not say."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code < 400 or response.status_code in ACCEPTED:
        return None
    if response.status_code >= 500:
        return None  # not_a_server_error's
    documented = set(case.operation.schema.raw_schema.get("info", {}).get("x-cross-field-rules", ()))
    try:
        body = json.loads(response.content)
        said = f"{body.get('field', '')}: {body.get('rule', '')}"
    except (ValueError, AttributeError):
        said = ""
    if response.status_code == 422 and said in documented:
        return None
    raise AssertionError(f"a schema-valid request was refused {response.status_code} by a rule the schema does not state: {said or response.text[:200]}")
