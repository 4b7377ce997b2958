"""Basic auth for ``/metrics``: bcrypt hashes as the exporter-toolkit writes them.

A hash is checked with bcrypt once per distinct (user, password); successes are cached
(bounded) so that scrapes do not pay bcrypt's ~100 ms each. Unknown users cost a bcrypt
check too (timing does not reveal user names). Checks run one at a time: bcrypt releases
the GIL, and a flood of wrong passwords then takes at most one core from the engine's
machine.

Example:
    >>> users = Passwords({"prom": hash_password("s3cret", 4).encode()})
    >>> users.check("prom", "s3cret"), users.check("prom", "nope"), users.check("x", "s3cret")
    (True, False, False)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kvobs.errors import ConfigError

_AUTH_CACHE_LIMIT = 1024
#: bcrypt releases the GIL, so checks run beside the engine; this bounds them to one.
_BCRYPT_SLOTS = threading.BoundedSemaphore(1)
_DUMMY_HASH = b"$2b$10$" + b"N9qo8uLOickgx2ZMRZoMye" + b"IjZAgcfl7p92ldGxad68LJZdL17lhWy"


def require(module: str, package: str) -> Any:
    """Import ``module`` (a dependency of the web config only) or say what to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"--web-config-file needs the {package} package: pip install {package}"
        ) from None


def hash_password(password: str, rounds: int = 10) -> str:
    """A bcrypt hash of ``password`` for ``basic_auth_users`` (what ``htpasswd -B`` writes)."""
    bcrypt = require("bcrypt", "bcrypt")
    return str(bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds)).decode())


def _normalise(hashed: bytes) -> bytes:
    # htpasswd and Go write $2y$; the bcrypt package checks $2b$, the same algorithm.
    return b"$2b$" + hashed[4:] if hashed.startswith(b"$2y$") else hashed


class Passwords:
    """User name -> bcrypt hash, checked with a bounded cache of successes."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self.users = dict(users)
        self._cache: dict[bytes, bool] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.users)

    def check(self, user: str, password: str) -> bool:
        """Whether ``password`` matches ``user``'s bcrypt hash (successes cached)."""
        bcrypt = require("bcrypt", "bcrypt")
        hashed = self.users.get(user)
        known = hashed is not None
        if hashed is None:  # spend the same time, so timing does not reveal user names
            hashed = _DUMMY_HASH
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed))).digest()
        if self._cache.get(key):
            return known
        with _BCRYPT_SLOTS:  # one check at a time: a flood of guesses takes one core, not all
            ok = bool(bcrypt.checkpw(password.encode(), _normalise(hashed))) and known
        if ok:
            with self._lock:
                if len(self._cache) >= _AUTH_CACHE_LIMIT:
                    self._cache.clear()
                self._cache[key] = True
        return ok

    def authorised(self, header: str) -> bool:
        """Whether an ``Authorization`` header carries a known user and its password."""
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(
                encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return bool(sep) and self.check(user, password)


def auth_app(app: Callable[..., Any], passwords: Passwords,
             headers: Mapping[str, str]) -> Callable[..., Any]:
    """Wrap the WSGI ``app``: basic auth when ``passwords`` has users; ``headers`` added to
    every response (``http_server_config.headers``)."""
    extra = list(headers.items())
    if not passwords and not extra:
        return app

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if passwords and not passwords.authorised(environ.get("HTTP_AUTHORIZATION", "")):
            start_response("401 Unauthorized", [
                ("WWW-Authenticate", 'Basic realm="kvobs", charset="UTF-8"'),
                ("Content-Type", "text/plain; charset=utf-8"), *extra])
            return [b"Unauthorized\n"]

        def respond(status: str, response_headers: list[tuple[str, str]], *exc: Any) -> Any:
            return start_response(status, response_headers + extra, *exc)

        return app(environ, respond)

    return wrapped
