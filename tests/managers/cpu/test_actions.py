"""Actions in real sandboxes: exec, sessions, files, state across actions, bad input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from arl_tangram.managers.cpu.errors import (
    InvalidRequestError,
    SandboxDeadError,
    SandboxNotFoundError,
)
from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.managers.cpu.results import Outcome


def test_exec_argv_shell_stdin_env_cwd(manager: CpuManager, sandbox: str) -> None:
    r = manager.exec(sandbox, ["/bin/cat"], stdin=b"hello\n")
    assert r.ok and r.stdout == b"hello\n" and r.exit_code == 0
    r = manager.exec(sandbox, "mkdir -p sub && cd sub && pwd && echo $FOO && id -u", env={"FOO": "bar"})
    assert r.stdout_text.split() == ["/workspace/sub", "bar", "1000"]
    assert manager.exec(sandbox, "pwd", cwd="sub").stdout_text.strip() == "/workspace/sub"
    r = manager.exec(sandbox, "exit 3")
    assert r.outcome is Outcome.FAILED and r.exit_code == 3
    assert r.wall_s > 0 and r.peak_mem_bytes > 0


def test_granted_dop_is_visible(manager: CpuManager, sandbox: str) -> None:
    for cores in (1, 2):
        r = manager.exec(sandbox, "echo $TANGRAM_DOP $(nproc)", cores=cores)
        want = min(cores, len(manager.topology.cpus))
        assert r.stdout_text.split() == [str(cores), str(want)]
        assert len(r.cpus) == want
    assert manager.core_load() == dict.fromkeys(manager.topology.cpus, 0)


def test_state_persists_across_actions(manager: CpuManager, sandbox: str) -> None:
    assert manager.exec(sandbox, "echo 42 > keep.txt").ok
    assert manager.exec(sandbox, "cat keep.txt").stdout == b"42\n"
    # a background process asked for survives its action and the freeze between actions
    assert manager.exec(sandbox, "nohup sleep 300 >/dev/null 2>&1 & echo $! > /tmp/bg.pid", background=True).ok
    r = manager.exec(sandbox, "kill -0 $(cat /tmp/bg.pid) && echo alive")
    assert r.stdout == b"alive\n"
    session = manager.open_session(sandbox)
    assert manager.run_in_session(session, "cd /tmp && export COLOR=blue && f() { echo fn; }").ok
    r = manager.run_in_session(session, "pwd; echo $COLOR; f; printf 'no newline'")
    assert r.stdout == b"/tmp\nblue\nfn\nno newline"
    r = manager.run_in_session(session, "cat <<'EOF'\nquote ' \" $x\nEOF\necho err >&2; false")
    assert r.stdout == b"quote ' \" $x\n" and r.stderr == b"err\n" and r.exit_code == 1
    r = manager.run_in_session(session, "echo $TANGRAM_DOP $(nproc)", cores=2)
    assert r.stdout_text.split()[0] == "2"
    manager.close_session(session)
    with pytest.raises(SandboxNotFoundError, match="session_id"):
        manager.run_in_session(session, "true")


def test_session_timeout_keeps_shell_and_exit_closes_it(manager: CpuManager, sandbox: str) -> None:
    session = manager.open_session(sandbox)
    manager.run_in_session(session, "export KEEP=1")
    r = manager.run_in_session(session, "sleep 30", timeout_s=0.3)
    assert r.outcome is Outcome.TIMED_OUT and r.wall_s < 5
    assert manager.run_in_session(session, "echo $KEEP").stdout == b"1\n"
    r = manager.run_in_session(session, "exit 7")
    assert r.exit_code == 7 and r.outcome is Outcome.FAILED
    with pytest.raises(SandboxNotFoundError):
        manager.run_in_session(session, "true")


def test_files_round_trip_and_upload_download(manager: CpuManager, sandbox: str, tmp_path: Path) -> None:
    manager.write_file(sandbox, "dir/a.bin", bytes(range(256)))
    assert manager.read_file(sandbox, "/workspace/dir/a.bin") == bytes(range(256))
    assert manager.exec(sandbox, "wc -c < dir/a.bin && echo x > dir/b.txt").stdout == b"256\n"
    assert manager.read_file(sandbox, "dir/b.txt") == b"x\n"
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("print('up')\n")
    (src / "top.txt").write_text("t")
    assert manager.upload(sandbox, str(src), "proj") == 2
    assert manager.exec(sandbox, ["python3", "proj/pkg/m.py"]).stdout == b"up\n"
    out = tmp_path / "out"
    assert manager.download(sandbox, "proj", str(out)) == 2
    assert (out / "pkg" / "m.py").read_text() == "print('up')\n"


def test_files_never_follow_sandbox_symlinks(manager: CpuManager, sandbox: str, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("host")
    assert manager.exec(sandbox, f"ln -s {secret} link && ln -s /etc evil").ok
    with pytest.raises(InvalidRequestError, match="path"):
        manager.read_file(sandbox, "link")
    with pytest.raises(InvalidRequestError, match="path"):
        manager.write_file(sandbox, "evil/passwd", "x")
    assert secret.read_text() == "host"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cores": 0}, "cores"),
        ({"cores": -2}, "cores"),
        ({"cores": 4096}, "cores: must be <= the"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"env": {"A=B": "x"}}, "env"),
        ({"cwd": "../../etc"}, "cwd"),
        ({"command": []}, "command"),
        ({"stdin": 5}, "stdin"),
    ],
)
def test_bad_input_names_field_and_rule(manager: CpuManager, sandbox: str, kwargs: dict, field: str) -> None:
    command = kwargs.pop("command", "true")
    with pytest.raises(InvalidRequestError, match=field):
        manager.exec(sandbox, command, **kwargs)


def test_bad_ids_and_paths(manager: CpuManager, sandbox: str) -> None:
    with pytest.raises(SandboxNotFoundError, match="sandbox_id"):
        manager.exec("nope", "true")
    with pytest.raises(InvalidRequestError, match="path: must stay inside"):
        manager.write_file(sandbox, "../etc/passwd", "x")
    with pytest.raises(InvalidRequestError, match="path"):
        manager.read_file(sandbox, "/etc/passwd")
    with pytest.raises(FileNotFoundError):
        manager.read_file(sandbox, "missing.txt")


def test_sandbox_idles_frozen_and_destroy_cleans(manager: CpuManager) -> None:
    sid = manager.create_sandbox()
    info = manager.sandbox_info(sid)
    assert info.state == "idle" and info.granted_cores == 0
    with open(f"/proc/{info.init_pid}/cgroup", encoding="ascii") as f:
        group = [line for line in f if ":freezer:" in line][0].split(":", 2)[2].strip()
    state_file = f"/sys/fs/cgroup/freezer{os.path.dirname(group)}/freezer.state"
    with open(state_file, encoding="ascii") as f:
        assert f.read().strip() in ("FROZEN", "FREEZING")
    manager.destroy_sandbox(sid)
    assert not os.path.exists(f"/proc/{info.init_pid}") or _is_zombie(info.init_pid) is False
    assert not os.path.exists(os.path.dirname(state_file))
    with pytest.raises(SandboxNotFoundError):
        manager.destroy_sandbox(sid)
    with pytest.raises(SandboxDeadError.__mro__[1]):
        manager.exec(sid, "true")


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False
