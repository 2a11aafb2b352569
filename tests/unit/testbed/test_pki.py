"""The test bed's certificates: one CA, a loopback serving certificate, client identities."""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from kubedl_prefect.testbed.components import Identity
from kubedl_prefect.testbed.pki import CertificateAuthority, service_account_key


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_serving_certificate_is_for_loopback_and_signed_by_the_ca(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    cert_path, key_path = ca.serving()
    cert = _cert(cert_path)
    cert.verify_directly_issued_by(ca.cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)  # the pair matches
    assert oct(key_path.stat().st_mode & 0o777) == "0o600"


def test_client_certificate_carries_user_and_groups(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    cert_path, _ = ca.client(Identity("alice", ("system:masters", "team")))
    subject = _cert(cert_path).subject
    assert subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    groups = [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert groups == ["system:masters", "team"]
    assert cert_path.name == "client-alice.crt"


def test_certificates_are_kept_until_something_changes(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    serving = ca.serving()[0].read_bytes()
    admin = ca.client(Identity("admin", ("system:masters",)), "admin")[0]
    first = admin.read_bytes()

    again = CertificateAuthority(tmp_path)
    assert again.cert_path.read_bytes() == ca.cert_path.read_bytes()
    assert again.serving()[0].read_bytes() == serving
    assert again.client(Identity("admin", ("system:masters",)), "admin")[0].read_bytes() == first

    regrouped = again.client(Identity("admin", ("viewers",)), "admin")[0]
    assert regrouped.read_bytes() != first
    groups = _cert(regrouped).subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [a.value for a in groups] == ["viewers"]


def test_a_new_ca_reissues_what_the_old_one_signed(tmp_path: Path) -> None:
    old = CertificateAuthority(tmp_path)
    before = old.serving()[0].read_bytes()
    old.cert_path.unlink()
    new = CertificateAuthority(tmp_path)
    assert new.cert != old.cert
    reissued = new.serving()[0]
    assert reissued.read_bytes() != before
    _cert(reissued).verify_directly_issued_by(new.cert)


def test_service_account_key_is_sec1_and_stable(tmp_path: Path) -> None:
    path = service_account_key(tmp_path)
    text = path.read_text()
    assert text.startswith("-----BEGIN EC PRIVATE KEY-----")  # what Kubernetes parses
    assert service_account_key(tmp_path).read_text() == text
