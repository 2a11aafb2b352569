"""Certificates and keys of a test bed: one CA, a loopback serving certificate, client certificates.

Everything is ECDSA P-256 (fast to generate, accepted by Go's TLS stack and by Kubernetes for
service-account tokens). Files are kept across restarts and only reissued when missing, close to
expiry, or issued by another CA, so kubeconfigs handed out earlier stay valid.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kubedl_prefect.testbed.components import Identity

_VALIDITY = dt.timedelta(days=365)
_RENEW_BEFORE = dt.timedelta(days=30)

#: Names the API server's certificate is valid for (loopback, plus the in-cluster service names
#: that clients of the ``kubernetes`` Service would check).
SERVING_DNS_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,  # SEC1: what Kubernetes parses everywhere
        serialization.NoEncryption(),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path} is not an ECDSA key")
    return key


def _still_valid(cert_path: Path, key_path: Path, issuer: x509.Certificate | None) -> bool:
    if not (cert_path.is_file() and key_path.is_file()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = _load_key(key_path)
    except ValueError:
        return False
    if cert.not_valid_after_utc - _RENEW_BEFORE < _now():
        return False
    if cert.public_key() != key.public_key():
        return False
    if issuer is not None:
        try:
            cert.verify_directly_issued_by(issuer)
        except (ValueError, TypeError, InvalidSignature):
            return False
    return True


class CertificateAuthority:
    """The test bed's CA: loaded from ``pki_dir`` or created there.

    Args:
        pki_dir: Folder of ``ca.crt``/``ca.key`` and everything issued by it.
    """

    def __init__(self, pki_dir: Path):
        self.pki_dir = pki_dir
        self.cert_path = pki_dir / "ca.crt"
        self.key_path = pki_dir / "ca.key"
        if not _still_valid(self.cert_path, self.key_path, None):
            self._create()
        self.cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        self.key = _load_key(self.key_path)

    def _create(self) -> None:
        key = _new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubedl-prefect-testbed-ca")])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        _write_key(self.key_path, key)
        _write_cert(self.cert_path, cert)

    def _issue(
        self,
        stem: str,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName] | None = None,
    ) -> tuple[Path, Path]:
        cert_path = self.pki_dir / f"{stem}.crt"
        key_path = self.pki_dir / f"{stem}.key"
        if _still_valid(cert_path, key_path, self.cert):
            return cert_path, key_path
        key = _new_key()
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        _write_key(key_path, key)
        _write_cert(cert_path, cert)
        return cert_path, key_path

    def serving(self) -> tuple[Path, Path]:
        """The serving certificate and key for 127.0.0.1/localhost (``serving.crt``/``.key``)."""
        sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        sans += [x509.DNSName(name) for name in SERVING_DNS_NAMES]
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
        return self._issue("serving", subject, ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def client(self, identity: Identity, stem: str | None = None) -> tuple[Path, Path]:
        """A client certificate and key for ``identity``: ``<stem>.crt``/``<stem>.key``.

        ``stem`` defaults to ``client-<user>`` (``:`` replaced by ``-``).
        """
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in identity.groups]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, identity.user))
        stem = stem or "client-" + identity.user.replace(":", "-")
        cert_path, key_path = self._issue(
            stem, x509.Name(attributes), ExtendedKeyUsageOID.CLIENT_AUTH
        )
        issued = x509.load_pem_x509_certificate(cert_path.read_bytes())
        if issued.subject != x509.Name(attributes):  # same user, other groups: reissue
            cert_path.unlink()
            return self._issue(stem, x509.Name(attributes), ExtendedKeyUsageOID.CLIENT_AUTH)
        return cert_path, key_path


def service_account_key(pki_dir: Path) -> Path:
    """The key that signs (and verifies) service-account tokens, created once: ``sa.key``."""
    path = pki_dir / "sa.key"
    try:
        _load_key(path)
    except (OSError, ValueError):
        _write_key(path, _new_key())
    return path
