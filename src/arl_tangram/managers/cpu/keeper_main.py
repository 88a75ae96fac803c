"""Shell: the keeper process's entry point (``python -m arl_tangram.managers.cpu.keeper_main
ROOT [CGROUP_PARENT]``); see ``keeper``. Kept apart so the package never imports it."""

from __future__ import annotations

import contextlib
import os
import sys

from arl_tangram.managers.cpu.cgroup_detect import detect_driver
from arl_tangram.managers.cpu.keeper import lock_path, sweep_root


def keeper_main(root_name: str, cgroup_parent: str) -> int:
    """Block until the manager's end of the pipe closes, then sweep its root."""
    with contextlib.suppress(OSError):
        while os.read(0, 4096):
            pass
    driver = detect_driver(root_name, cgroup_parent=cgroup_parent or None)
    if driver.root_exists():
        sweep_root(driver)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock_path(root_name))
    return 0


if __name__ == "__main__":
    sys.exit(keeper_main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""))
