"""Certificates for the SuperLink (TLS) and SuperNode authentication keys, generated for a run.

Every file is written as a new file (:func:`write_new_file`): a folder that already holds one, or a
symbolic link in its place, is refused rather than overwritten or followed.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .options import DeploymentOptions


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a run's certificate authority and the SuperLink's certificate."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def make_tls_files(folder: Path, names: Iterable[str], days: int = 30) -> TlsFiles:
    """A fresh CA and a SuperLink certificate signed by it, valid for ``names`` (host names or IP addresses).

    Parameters
    ----------
    folder : pathlib.Path
        Where ``ca.pem``, ``server.pem`` and ``server.key`` (mode 600) are written.
    names : iterable of str
        Subject alternative names; SuperNodes must reach the SuperLink under one of them.
    days : int
        Validity.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_certificate(ca_key, start, end)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _server_certificate(server_key, ca_key, ca_cert.subject, names, start, end)

    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    write_new_file(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), PUBLIC)
    write_new_file(files.server_cert, server_cert.public_bytes(serialization.Encoding.PEM), PUBLIC)
    write_new_file(
        files.server_key,
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    return files


def _ca_certificate(ca_key: Any, start: datetime.datetime, end: datetime.datetime) -> Any:
    """The run's self-signed CA certificate (it signs only the SuperLink's certificate)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedica deployment CA")])
    return (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _server_certificate(
    server_key: Any, ca_key: Any, ca_name: Any, names: Iterable[str], start: datetime.datetime, end: datetime.datetime
) -> Any:
    """The SuperLink's certificate for ``names``, signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    alt_names: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedica SuperLink")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def make_node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode authentication key pair (EC P-384, OpenSSH format, as Flower 1.42 expects).

    Returns
    -------
    private_key, public_key : pathlib.Path
        ``<folder>/<name>`` (mode 600) and ``<folder>/<name>.pub``.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private_path, public_path = folder / name, folder / f"{name}.pub"
    write_new_file(
        private_path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()),
    )
    write_new_file(
        public_path,
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n",
        PUBLIC,
    )
    return private_path, public_path


SECRET, PUBLIC = 0o600, 0o644


def write_new_file(path: Path, data: bytes, mode: int = SECRET) -> None:
    """Write ``data`` to ``path``, which must not exist yet, with ``mode`` (600 by default: a secret).

    Neither the file nor its folder may be a symbolic link: an existing file (or link) there is
    refused with :class:`FileExistsError` naming it, never overwritten, and its mode never kept.
    The folder is created (mode 700) when missing.
    """
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as err:
        raise FileExistsError(f"{path.parent}: not a plain folder ({err.strerror}); keys are written only into a real folder") from None
    try:
        try:
            fd = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=folder)
        except FileExistsError:
            raise FileExistsError(f"{path} already exists: keys and certificates are written only as new files "
                                  "(choose an empty folder, or delete the old files)") from None
        os.fchmod(fd, mode)  # the umask must not widen or narrow what is intended
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    finally:
        os.close(folder)


def certificate_names(options: DeploymentOptions, extra: Iterable[str] = ()) -> list[str]:
    """Names the SuperLink certificate must carry: loopback, the listen address, and ``extra``."""
    names = ["localhost", "127.0.0.1", "::1"]
    if options.host not in ("0.0.0.0", "::", ""):
        names.append(options.host)
    return names + [name for name in extra if name]
