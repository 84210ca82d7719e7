"""An HTTPS proxy on loopback that answers for a public host with the fake upstream.

Examples written for a real endpoint (``base_url="https://api.openai.com/v1"``) run unchanged
against the fake: the client is pointed at this proxy by the standard variables its HTTP stack
reads (``HTTPS_PROXY``, and ``SSL_CERT_FILE`` for a test certificate authority). The proxy
accepts ``CONNECT host:443``, completes TLS with a certificate for that host signed by the
test CA, and hands the decrypted connection to a ``FakeUpstream``. Nothing leaves the machine:
no connection is ever made to the named host.

    async with FakeUpstream() as upstream, TLSInterceptor(upstream, "api.openai.com") as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("SSL_CERT_FILE", str(proxy.ca_file))
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
import tempfile
from pathlib import Path
from types import TracebackType

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .upstream import FakeUpstream

__all__ = ["TLSInterceptor", "server_context"]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def server_context(hosts: frozenset[str], directory: Path) -> ssl.SSLContext:
    """A server TLS context for ``hosts``, its certificate signed by a new test CA, whose
    certificate is written to ``directory / "ca.pem"``."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("agent-runtime test CA"))
        .issuer_name(_name("agent-runtime test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(sorted(hosts)[0]))
        .issuer_name(ca.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(host) for host in sorted(hosts)]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain = directory / "leaf.pem"
    key = directory / "leaf.key"
    chain.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(chain, key)
    return context


class TLSInterceptor:
    """See the module docstring. ``hosts`` are the names it answers for; others are refused."""

    def __init__(self, upstream: FakeUpstream, *hosts: str) -> None:
        self.upstream = upstream
        self.hosts = frozenset(hosts)
        self.connects: list[str] = []
        self._server: asyncio.Server | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="tls-interceptor-")
        self.ca_file = Path(self._dir.name) / "ca.pem"
        self._context = self._certificates()
        self.port = 0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: the value of ``HTTPS_PROXY``."""
        return f"http://127.0.0.1:{self.port}"

    def _certificates(self) -> ssl.SSLContext:
        return server_context(self.hosts, Path(self._dir.name))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            method, target, _ = request.decode("latin-1").split(" ", 2)
            host, _, port = target.rpartition(":")
            self.connects.append(target)
            if method != "CONNECT" or host not in self.hosts or port != "443":
                writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                writer.close()
                return
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await writer.start_tls(self._context)
        except (ConnectionError, ssl.SSLError, ValueError):
            writer.close()
            return
        # the fake upstream serves the decrypted connection as any other
        await self.upstream._serve(reader, writer)

    async def __aenter__(self) -> TLSInterceptor:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        self._dir.cleanup()
