"""A real docker-registry (distribution 2.x) on 127.0.0.1 for tests: temp storage and config,
an access log to count blob fetches, optional htpasswd basic auth; stopped by PID after.
Images are pushed with skopeo from OCI layouts the tests build."""

from __future__ import annotations

import crypt
import re
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """One docker-registry process; ``host`` is its HOST:PORT."""

    def __init__(self, workdir: Path, htpasswd: tuple[str, str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.log_path = workdir / "registry.log"
        self.auth = htpasswd
        auth = ""
        if htpasswd:
            user, password = htpasswd
            (workdir / "htpasswd").write_text(f"{user}:{crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))}\n")
            auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {workdir / 'htpasswd'}\n"
        (workdir / "config.yml").write_text(
            f"version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n"
            f"storage:\n  filesystem:\n    rootdirectory: {workdir / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n{auth}")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(["docker-registry", "serve", str(workdir / "config.yml")],
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://{self.host}/v2/", timeout=1, trust_env=False)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("docker-registry did not start")

    def push(self, layout: Path, name: str, tag: str = "latest") -> str:
        ref = f"{self.host}/{name}:{tag}"
        cmd = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
        if self.auth:
            cmd.append(f"--dest-creds={self.auth[0]}:{self.auth[1]}")
        subprocess.run(cmd + [f"oci:{layout}:{tag}", f"docker://{ref}"], check=True, capture_output=True, timeout=120)
        return ref

    def blob_gets(self) -> Counter[str]:
        """Blob GETs answered 200, by digest, from the access log (manifests excluded)."""
        text = self.log_path.read_text(errors="replace")
        return Counter(re.findall(r'"GET /v2/[^"]*/blobs/(sha256:[0-9a-f]{64}) HTTP/1\.1" 200', text))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
