"""Certificates for a loopback control plane: one CA, server certificates it signs, key files.

Written with ``cryptography`` (no openssl binary needed). Keys are ECDSA P-256 (a 2048-bit RSA
key costs ~55 ms of CPU to make, a P-256 one ~0.02 ms; a plane makes ~10), in the traditional
format. One exception: the Training Operator's cert rotator reads its CA key as PKCS#1 RSA only,
so that CA has an RSA key (``rsa_key=True``).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

LOOPBACK_NAMES = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1",)


PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def _key(*, rsa_key: bool = False) -> PrivateKey:
    if rsa_key:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    """Ten years: the Training Operator's cert rotator replaces certificates that expire within
    its 90-day look-ahead (and then serves ones our webhook configurations do not trust)."""
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(
        now + datetime.timedelta(days=3650)
    )


@dataclass(frozen=True)
class Pem:
    """A certificate and its key, PEM-encoded."""

    cert: bytes
    key: bytes

    def write(self, folder: Path, cert_name: str = "tls.crt", key_name: str = "tls.key") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / cert_name).write_bytes(self.cert)
        (folder / key_name).write_bytes(self.key)
        (folder / key_name).chmod(0o600)


class CertificateAuthority:
    """A throw-away CA that signs loopback server certificates.

    Its name is also a DNS name of the certificate: the Training Operator's cert rotator verifies
    its CA for the DNS name ``training-operator-ca`` before it trusts it. ``rsa_key``: the CA's
    own key is RSA (the certificates it signs keep P-256 keys).
    """

    def __init__(self, common_name: str = "kfp-ddp-test-ca", *, rsa_key: bool = False):
        self._key = _key(rsa_key=rsa_key)
        subject = _name(common_name)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(common_name)]), critical=False)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
        )
        self._cert = _validity(builder).sign(self._key, hashes.SHA256())
        self.pem = Pem(self._cert.public_bytes(serialization.Encoding.PEM), _pem_key(self._key))

    def server(self, common_name: str, dns_names: tuple[str, ...] = ()) -> Pem:
        """A server certificate for 127.0.0.1, localhost and ``dns_names``."""
        key = _key()
        names = [x509.DNSName(n) for n in (*LOOPBACK_NAMES, *dns_names)]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in LOOPBACK_IPS]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
        )
        cert = _validity(builder).sign(self._key, hashes.SHA256())
        return Pem(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))

    def client(self, common_name: str, organization: str) -> Pem:
        """A client certificate: user ``common_name`` in group ``organization`` (e.g. the API
        server's certificate for kubelets, in ``system:masters``)."""
        key = _key()
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            ]
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
        )
        cert = _validity(builder).sign(self._key, hashes.SHA256())
        return Pem(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def signing_key_pair(folder: Path) -> tuple[Path, Path]:
    """A service-account signing key pair: (private key file, public key file)."""
    key = _key()
    private, public = folder / "sa.key", folder / "sa.pub"
    private.write_bytes(_pem_key(key))
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public
