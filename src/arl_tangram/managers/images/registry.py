"""Shell: a client of the OCI distribution API (one registry host) over httpx.

Auth: anonymous first; on a 401 it answers the ``WWW-Authenticate`` challenge: ``Bearer``
(a token from the realm, with basic credentials if configured, cached per scope) or
``Basic``. Manifests are fetched with the OCI and Docker v2 types accepted; an index
resolves to linux/amd64. Every manifest fetched by digest and every config blob is verified
here; layer blobs are verified by the caller's stream (``streams.unpack_blob``).
Credentials never appear in logs or errors (they travel in headers, never in URLs).
"""

from __future__ import annotations

import base64
import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from arl_tangram.managers.images import manifest as mf
from arl_tangram.managers.images.config import RegistryCredentials
from arl_tangram.managers.images.errors import ImageNotFoundError, RegistryError
from arl_tangram.managers.images.reference import ImageReference

_ACCEPT = ", ".join(mf.MANIFEST_TYPES + mf.INDEX_TYPES)
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ResolvedImage:
    """An image as the registry describes it: its manifest's digest, layers and config."""

    manifest_digest: str
    manifest: mf.ImageManifest
    config_bytes: bytes


class RegistryClient:
    """One registry host. Thread-safe: httpx's client is, and the token cache has a lock."""

    def __init__(self, creds: RegistryCredentials, timeout_s: float = 60.0) -> None:
        self._creds = creds
        self.host = creds.host
        self._base = f"{'http' if creds.insecure else 'https'}://{creds.host}"
        self._http = httpx.Client(timeout=timeout_s, follow_redirects=True, trust_env=False)
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = {}
        self._use_basic = False

    def close(self) -> None:
        self._http.close()

    def resolve(self, ref: ImageReference) -> ResolvedImage:
        """The image ``ref`` names, its index resolved to linux/amd64 and its config fetched."""
        what = f"{self.host}/{ref.repository}:{ref.manifest_ref}"
        data, media_type, digest = self._manifest(ref.repository, ref.manifest_ref, what)
        if mf.media_type_of(data, media_type, what) in mf.INDEX_TYPES:
            entry = mf.select_platform(mf.parse_index(data, what), what)
            data, media_type, digest = self._manifest(ref.repository, entry.digest, what)
        manifest = mf.parse_manifest(data, what)
        config = self._small_blob(ref.repository, manifest.config, f"{what} config")
        return ResolvedImage(digest, manifest, config)

    @contextlib.contextmanager
    def blob(self, repository: str, digest: str) -> Iterator[Iterator[bytes]]:
        """A layer blob's body as a stream of chunks (unverified: the caller hashes it)."""
        resp = self._send("GET", f"/v2/{repository}/blobs/{digest}", repository, f"layer {digest}", stream=True)
        try:
            yield self._chunks(resp, digest)
        finally:
            resp.close()

    def _chunks(self, resp: httpx.Response, digest: str) -> Iterator[bytes]:
        try:
            yield from resp.iter_bytes(_CHUNK)
        except httpx.TransportError as exc:
            raise RegistryError("registry", f"{self.host}: layer {digest}: transfer broke: {type(exc).__name__}") from None

    def _manifest(self, repository: str, ref: str, what: str) -> tuple[bytes, str | None, str]:
        resp = self._send("GET", f"/v2/{repository}/manifests/{ref}", repository, f"manifest {what}",
                          headers={"Accept": _ACCEPT})
        data = resp.content
        if len(data) > mf.MAX_JSON_BYTES:
            raise RegistryError("registry", f"{what}: manifest larger than {mf.MAX_JSON_BYTES} bytes")
        digest = mf.sha256_digest(data)
        if ref.startswith("sha256:"):
            mf.verify(data, ref, f"manifest {what}")
        return data, resp.headers.get("content-type", "").split(";")[0] or None, digest

    def _small_blob(self, repository: str, desc: mf.Descriptor, what: str) -> bytes:
        if desc.size > mf.MAX_JSON_BYTES:
            raise RegistryError("registry", f"{what}: declares {desc.size} bytes, over {mf.MAX_JSON_BYTES}")
        resp = self._send("GET", f"/v2/{repository}/blobs/{desc.digest}", repository, what)
        mf.verify(resp.content, desc.digest, what)
        return resp.content

    def _send(self, method: str, path: str, repository: str, what: str, *, stream: bool = False,
              headers: dict[str, str] | None = None) -> httpx.Response:
        """Send with auth, answering one 401 challenge; raise naming the status on an error."""
        scope = f"repository:{repository}:pull"
        resp = self._once(method, path, scope, headers or {}, stream)
        if resp.status_code == 401:
            challenge = resp.headers.get("www-authenticate", "")
            resp.close()
            self._authenticate(challenge, scope)
            resp = self._once(method, path, scope, headers or {}, stream)
            if resp.status_code == 401:
                resp.close()
                raise RegistryError("registry", f"{self.host} answered 401 for {what}: credentials rejected",
                                    status=401)
        if resp.status_code >= 400:
            status = resp.status_code
            resp.close()
            if status == 404:
                raise ImageNotFoundError("image", f"{self.host} answered 404 for {what}")
            raise RegistryError("registry", f"{self.host} answered {status} for {what}", status=status)
        return resp

    def _once(self, method: str, path: str, scope: str, headers: dict[str, str], stream: bool) -> httpx.Response:
        with self._lock:
            token, basic = self._tokens.get(scope), self._use_basic
        auth_headers = dict(headers)
        if token:
            auth_headers["Authorization"] = f"Bearer {token}"
        elif basic:
            pair = f"{self._creds.username}:{self._creds.secret()}".encode()
            auth_headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        request = self._http.build_request(method, self._base + path, headers=auth_headers)
        try:
            return self._http.send(request, stream=stream)
        except httpx.TransportError as exc:
            raise RegistryError("registry", f"{self.host} unreachable: {type(exc).__name__}") from None

    def _authenticate(self, challenge: str, scope: str) -> None:
        scheme = challenge.split(" ", 1)[0].lower()
        if scheme == "basic":
            if not self._creds.username:
                raise RegistryError("registry", f"{self.host} answered 401: needs credentials, none configured",
                                    status=401)
            with self._lock:
                self._use_basic = True
            return
        if scheme != "bearer":
            raise RegistryError("registry", f"{self.host} answered 401 with an unsupported challenge {scheme!r}",
                                status=401)
        params = dict(_CHALLENGE_PARAM.findall(challenge))
        realm = params.get("realm")
        if not realm or not realm.startswith(("http://", "https://")):
            raise RegistryError("registry", f"{self.host}: bearer challenge has no http(s) realm", status=401)
        query = {"service": params.get("service", ""), "scope": params.get("scope", scope)}
        auth = httpx.BasicAuth(self._creds.username, self._creds.secret()) if self._creds.username else None
        try:
            resp = self._http.get(realm, params=query, auth=auth)
        except httpx.TransportError as exc:
            raise RegistryError("registry", f"{self.host}: token server unreachable: {type(exc).__name__}") from None
        if resp.status_code != 200:
            raise RegistryError("registry", f"{self.host}: token server answered {resp.status_code}",
                                status=resp.status_code)
        try:
            body = resp.json()
            token = body.get("token") or body.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise RegistryError("registry", f"{self.host}: token server's answer has no token")
        with self._lock:
            self._tokens[scope] = token
