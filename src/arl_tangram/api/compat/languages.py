"""Shell: the languages the SandboxFusion face runs, and how (source file, compile and run argv).

A language is offered when its toolchain is on the sandbox's PATH (the host's read-only
``/usr`` and ``/bin``): python, bash, C and C++ always (``.ci/run`` installs gcc/g++), and
nodejs, typescript, java, go, rust, php, perl, ruby, lua when their tools are there. A
language ``[sandboxfusion] language_images`` names runs in a sandbox on that image instead
(its toolchain is the image's; the commands are this table's), whether or not the host has
it. Anything else is refused up front with the list of what this server offers and how to
offer more, never run as something else.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

# The sandbox's PATH (managers/cpu/launch.SANDBOX_PATH): a tool elsewhere (~/.cargo/bin)
# exists on the host but not inside the sandbox, so it must not make a language offered.
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Language:
    """``source`` is written into the workspace; ``compile`` (if any) runs first under
    ``compile_timeout``, then ``run`` under ``run_timeout``; ``tools`` must all be found."""

    name: str
    source: str
    run: tuple[str, ...]
    compile: tuple[str, ...] | None = None
    tools: tuple[str, ...] = ()


LANGUAGES: tuple[Language, ...] = (
    Language("python", "main.py", ("python3", "main.py"), tools=("python3",)),
    Language("bash", "main.sh", ("bash", "main.sh"), tools=("bash",)),
    Language("c", "main.c", ("./main",), ("gcc", "-O2", "-std=gnu11", "-o", "main", "main.c", "-lm"), ("gcc",)),
    Language("cpp", "main.cpp", ("./main",), ("g++", "-O2", "-std=gnu++17", "-o", "main", "main.cpp", "-lm"), ("g++",)),
    Language("nodejs", "main.js", ("node", "main.js"), tools=("node",)),
    Language("typescript", "main.ts", ("node", "main.js"), ("tsc", "--target", "es2020", "--module", "commonjs", "main.ts"), ("tsc", "node")),
    Language("java", "Main.java", ("java", "-Xss64m", "-cp", ".", "Main"), ("javac", "-encoding", "UTF-8", "Main.java"), ("javac", "java")),
    Language("go", "main.go", ("./main",), ("go", "build", "-o", "main", "main.go"), ("go",)),
    Language("rust", "main.rs", ("./main",), ("rustc", "-O", "-o", "main", "main.rs"), ("rustc",)),
    Language("php", "main.php", ("php", "main.php"), tools=("php",)),
    Language("perl", "main.pl", ("perl", "main.pl"), tools=("perl",)),
    Language("ruby", "main.rb", ("ruby", "main.rb"), tools=("ruby",)),
    Language("lua", "main.lua", ("lua", "main.lua"), tools=("lua",)),
)
ALIASES = {"python3": "python", "c++": "cpp", "sh": "bash", "javascript": "nodejs", "ts": "typescript"}
HINT = "; set [sandboxfusion] language_images to run another language in an image that carries its toolchain"


@functools.cache
def available() -> dict[str, Language]:
    """The languages whose every tool is on the sandbox's PATH (probed once per process)."""
    return {lang.name: lang for lang in LANGUAGES if all(shutil.which(t, path=SANDBOX_PATH) for t in lang.tools)}


class UnknownLanguage(ValueError):
    """The request names a language this server cannot run (a 422 naming ``language``)."""

    def __init__(self, name: str, images: Mapping[str, str] | None = None) -> None:
        offered = ", ".join(sorted({*available(), *(images or {})}))
        self.field = "language"
        self.rule = f"must be one of {offered} on this host{HINT}"
        self.value = name
        super().__init__(f"language: {self.rule} (got {name!r})")


@dataclass(frozen=True)
class Placement:
    """Where a run of ``language`` goes: ``image`` ``"host"`` (the host's toolchain) or the
    image ``language_images`` names."""

    language: Language
    image: str = "host"


def resolve(name: str, images: Mapping[str, str] | None = None) -> Placement:
    """Where a request's ``language`` runs: in its configured image (``images``: language ->
    image), else on the host when the host has its toolchain; ``UnknownLanguage`` if neither."""
    key = ALIASES.get(name, name)
    if images and key in images:
        return Placement(next(lang for lang in LANGUAGES if lang.name == key), images[key])
    found = available().get(key)
    if found is None:
        raise UnknownLanguage(name, images)
    return Placement(found)
