"""``swarmyard certs init``: a private CA, a server certificate and a client certificate for mutual TLS.

Keys are ECDSA P-256, written with mode 0600 through ``O_EXCL`` (never chmod-ed after the fact, never
overwritten); certificates are public and written 0644, also refusing to overwrite.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from swarmyard.errors import UserError
from swarmyard.secret_files import write_secret_file


@dataclass(frozen=True, slots=True)
class CertPaths:
    """The files ``init`` writes into one folder."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def in_folder(cls, folder: Path) -> CertPaths:
        """The standard names inside ``folder``."""
        return cls(folder / "ca.pem", folder / "ca.key", folder / "server.pem", folder / "server.key",
                   folder / "client.pem", folder / "client.key")


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write_public(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _leaf(name: str, key: ec.EllipticCurvePrivateKey, ca_name: x509.Name, ca_key: ec.EllipticCurvePrivateKey,
          usage: x509.ObjectIdentifier, now: dt.datetime, days: int,
          hosts: Sequence[str] = ()) -> x509.Certificate:
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                            content_commitment=False, data_encipherment=False,
                                            key_agreement=True, key_cert_sign=False, crl_sign=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if hosts:
        builder = builder.add_extension(_san(hosts), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def init_certs(folder: Path, hosts: Sequence[str], *, client_name: str = "swarmyard-client",
               days: int = 365) -> CertPaths:
    """Create the CA, server and client certificates in ``folder``; refuse if any file already exists."""
    if not hosts:
        raise UserError("give at least one --host for the server certificate (a DNS name or an IP address)")
    if days < 1:
        raise UserError("--days must be at least 1")
    paths = CertPaths.in_folder(folder)
    existing = [p.name for p in vars_of(paths) if p.exists()]
    if existing:
        raise UserError(f"{folder} already holds {', '.join(existing)}; choose an empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "swarmyard CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=False, key_encipherment=False,
                                            content_commitment=False, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=True, crl_sign=True,
                                            encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    server_key = ec.generate_private_key(ec.SECP256R1())
    client_key = ec.generate_private_key(ec.SECP256R1())
    server = _leaf(hosts[0], server_key, ca_name, ca_key, ExtendedKeyUsageOID.SERVER_AUTH, now, days, hosts)
    client = _leaf(client_name, client_key, ca_name, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH, now, days)
    pem = serialization.Encoding.PEM
    try:
        write_secret_file(paths.ca_key, _key_pem(ca_key))
        write_secret_file(paths.server_key, _key_pem(server_key))
        write_secret_file(paths.client_key, _key_pem(client_key))
        _write_public(paths.ca_cert, ca_cert.public_bytes(pem))
        _write_public(paths.server_cert, server.public_bytes(pem))
        _write_public(paths.client_cert, client.public_bytes(pem))
    except FileExistsError as exc:
        raise UserError(f"{exc.filename} appeared while writing; nothing was overwritten") from exc
    return paths


def vars_of(paths: CertPaths) -> list[Path]:
    """Every path in ``paths``."""
    return [paths.ca_cert, paths.ca_key, paths.server_cert, paths.server_key, paths.client_cert,
            paths.client_key]
