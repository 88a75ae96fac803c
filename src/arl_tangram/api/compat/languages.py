"""Shell: the languages the SandboxFusion face runs, and how (source file, compile and run argv).

A language is offered when its toolchain is on the sandbox's PATH (the host's read-only
``/usr`` and ``/bin``): python, bash, C and C++ always (``.ci/run`` installs gcc/g++), and
nodejs, java, go, rust, php, perl, ruby, lua when their tools are there. Anything else is
refused up front with the list of what this host offers, never run as something else.
"""

from __future__ import annotations

import functools
import shutil
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
    Language("java", "Main.java", ("java", "-Xss64m", "-cp", ".", "Main"), ("javac", "-encoding", "UTF-8", "Main.java"), ("javac", "java")),
    Language("go", "main.go", ("./main",), ("go", "build", "-o", "main", "main.go"), ("go",)),
    Language("rust", "main.rs", ("./main",), ("rustc", "-O", "-o", "main", "main.rs"), ("rustc",)),
    Language("php", "main.php", ("php", "main.php"), tools=("php",)),
    Language("perl", "main.pl", ("perl", "main.pl"), tools=("perl",)),
    Language("ruby", "main.rb", ("ruby", "main.rb"), tools=("ruby",)),
    Language("lua", "main.lua", ("lua", "main.lua"), tools=("lua",)),
)
ALIASES = {"python3": "python", "c++": "cpp", "sh": "bash", "javascript": "nodejs"}


@functools.cache
def available() -> dict[str, Language]:
    """The languages whose every tool is on the sandbox's PATH (probed once per process)."""
    return {lang.name: lang for lang in LANGUAGES if all(shutil.which(t, path=SANDBOX_PATH) for t in lang.tools)}


class UnknownLanguage(ValueError):
    """The request names a language this host cannot run (a 422 naming ``language``)."""

    def __init__(self, name: str) -> None:
        offered = ", ".join(sorted(available()))
        super().__init__(f"language: must be one of {offered} on this host (got {name!r})")
        self.field = "language"
        self.rule = f"must be one of {offered} on this host"
        self.value = name


def resolve(name: str) -> Language:
    """The ``Language`` for a request's ``language``; ``UnknownLanguage`` if not offered."""
    found = available().get(ALIASES.get(name, name))
    if found is None:
        raise UnknownLanguage(name)
    return found
