"""Helpers for the S3 sync tests: seeding objects, reading folders, counting S3 requests."""

from __future__ import annotations

import hashlib
import http.client
import os
import ssl
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


def put_objects(client, bucket: str, objects: dict[str, bytes]) -> None:
    """PUT every ``key: body`` (in parallel)."""
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda kv: client.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), objects.items()
            )
        )


def list_keys(client, bucket: str, prefix: str = "") -> dict[str, bytes]:
    """``key: body`` of every object under ``prefix``."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", ()):
            out[obj["Key"]] = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


def read_tree(root: Path) -> dict[str, bytes]:
    """``relative path: bytes`` of every regular file under ``root`` (not following links)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


class CountingProxy:
    """A loopback HTTP proxy in front of an S3 endpoint that counts requests by kind.

    It passes the Host header through unchanged, so SigV4 signatures stay valid.
    ``counts``: Counter of "LIST", "GET", "HEAD", "PUT", "POST", "DELETE".
    ``corrupt``: a byte string; an object GET whose body contains it gets one byte of it flipped
    on the way (bit rot / a broken middlebox between S3 and us).
    ``tls``: (certificate file, key file): serve HTTPS at ``https://localhost:PORT`` (an S3
    behind a certificate of its own CA, like many MinIO setups).
    """

    def __init__(
        self,
        upstream: str,
        *,
        corrupt: bytes | None = None,
        tls: tuple[str, str] | None = None,
    ) -> None:
        target = urlsplit(upstream)
        self.counts: Counter[str] = Counter()
        lock = threading.Lock()
        counts = self.counts

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                kind = self.command
                if kind == "GET" and "list-type=" in self.path:
                    kind = "LIST"
                with lock:
                    counts[kind] += 1
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if corrupt and kind == "GET" and corrupt in data:
                    data = data.replace(corrupt, bytes([corrupt[0] ^ 1]) + corrupt[1:], 1)
                self.send_response(resp.status, resp.reason)
                for key, value in resp.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        port = self.server.server_address[1]
        self.endpoint_url = f"http://127.0.0.1:{port}"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            self.endpoint_url = f"https://localhost:{port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def self_signed_cert(folder: Path) -> tuple[str, str]:
    """A CA-less self-signed certificate for ``localhost``/127.0.0.1: (cert file, key file)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "s3-cert.pem", folder / "s3-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_file), str(key_file)
