"""Certificates made in the test with the ``openssl`` binary: a CA, a server and a client.

Each call writes a fresh CA and leaf certificates under ``directory``; nothing is shared
between tests and nothing is checked in.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.required import missing


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    directory: Path

    def leaf(self, name: str, *, server: bool) -> tuple[Path, Path]:
        """A certificate (and its key) for ``name`` signed by this CA."""
        key, csr, cert = (self.directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
        ext = self.directory / f"{name}.ext"
        if server:
            ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                           "extendedKeyUsage=serverAuth\n")
        else:
            ext.write_text("extendedKeyUsage=clientAuth\n")
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
        _openssl("x509", "-req", "-in", csr, "-CA", self.ca_cert, "-CAkey", self.ca_key,
                 "-CAcreateserial", "-days", "2", "-out", cert, "-extfile", ext)
        return cert, key


def make_ca(directory: Path, name: str = "test-ca") -> Pki:
    """A self-signed CA in ``directory``."""
    if shutil.which("openssl") is None:
        missing("the openssl binary is needed to make test certificates (apt-get install openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return Pki(cert, key, directory)


def _openssl(*args: object) -> None:
    result = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True,
                            timeout=60)
    if result.returncode:
        raise AssertionError(f"openssl {' '.join(map(str, args))} failed:\n{result.stderr}")
