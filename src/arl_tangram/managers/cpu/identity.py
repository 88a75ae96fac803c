"""Pure: the user database a sandbox on the host root sees.

The host root binds the host's ``/etc`` read-only, which would show every host account and
make ``whoami`` print whatever host user shares the sandbox's uid (or nothing at all). A
generated ``/etc/passwd`` and ``/etc/group`` are bound read-only over the host's instead: they
name only ``root``, the sandbox's own unprivileged user and ``nobody``. An image root needs
none of this: its ``/etc`` comes from the image.
"""

from __future__ import annotations

from arl_tangram.managers.cpu.launch import SandboxLayout

#: the name ``whoami`` prints inside a host-root sandbox
SANDBOX_USER = "sandbox"
PASSWD_PATH = "/etc/passwd"
GROUP_PATH = "/etc/group"


def identity_files(layout: SandboxLayout) -> dict[str, bytes]:
    """sandbox path -> contents of the generated ``/etc/passwd`` and ``/etc/group``; the
    sandbox user's home is the workspace (the only place it can write that persists)."""
    uid, gid = layout.sandbox_uid, layout.sandbox_gid
    passwd = (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"{SANDBOX_USER}:x:{uid}:{gid}:{SANDBOX_USER}:{layout.workspace}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    group = f"root:x:0:\n{SANDBOX_USER}:x:{gid}:\nnogroup:x:65534:\n"
    return {PASSWD_PATH: passwd.encode(), GROUP_PATH: group.encode()}
