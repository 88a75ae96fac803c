"""Shell: who may register which model service over HTTP: the operator's allowlist.

Registering by module path (``pkg.mod:factory``, code the server imports and calls) or by
a folder on the server's disk is an operator's power. The operator grants it in the
configuration (``[service] allowed_modules``, ``allowed_folders``, or ``[[services]]``,
which the operator's runtime registers itself); over HTTP a tenant may name only what is
listed there. ``check_allowed`` runs before anything is imported or read: it compares
strings (a module factory must be listed exactly) and resolved paths (a folder must be a
listed one or lie inside one, after symlinks), so a refused request imports nothing.

Who calls: ``routes_services.register_service``, on a worker thread (resolving a path
touches the disk). What it returns is the allowlist's own entry, never the request's
string: the factory that is imported is always one an operator wrote down.
"""

from __future__ import annotations

import os

from arl_tangram.client.builtin import builtin_folders
from arl_tangram.runtime.config import ServiceSettings


class Forbidden(PermissionError):
    """A tenant asked for an operator's power it was not granted: 403 naming the field
    and the rule."""

    def __init__(self, field: str, rule: str, value: object) -> None:
        super().__init__(f"{field}: {rule} (got {value!r})")
        self.field, self.rule, self.value = field, rule, value


def allowed_module(module: str, settings: ServiceSettings) -> str:
    """The allowlist's entry equal to ``module``; ``Forbidden`` when there is none."""
    for entry in settings.allowed_modules:
        if entry == module:
            return entry
    raise Forbidden(
        "module", "must be one of the factories the operator allows ([service] allowed_modules); "
        "registering other code is the operator's, in the configuration", module,
    )  # fmt: skip


def allowed_folder(folder: str, settings: ServiceSettings) -> str:
    """``folder`` resolved (symlinks followed), when it is a listed folder or inside one;
    ``Forbidden`` otherwise; a built-in model's folder (``client.builtin``) is always allowed.
    A relative path is refused: it would depend on the server's working directory."""
    rule = "must be a model folder the operator allows ([service] allowed_folders), or one inside it"
    if not os.path.isabs(folder):
        raise Forbidden("folder", rule + ", as an absolute path", folder)
    real = os.path.realpath(folder)
    if real in {os.path.realpath(f) for f in builtin_folders()}:
        return real  # the package's own model (client.builtin): safetensors, no one's code
    for entry in settings.allowed_folders:
        root = os.path.realpath(entry)
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return real
    raise Forbidden("folder", rule, folder)
