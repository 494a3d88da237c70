"""The rate limiter, body limit, certificates and listen checks, without a server."""

from __future__ import annotations

import ssl
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from cryptography import x509

from swarmyard.clock import FakeClock
from swarmyard.errors import PayloadTooLargeError, RateLimitedError, UserError
from swarmyard.plane.certs import init_certs, vars_of
from swarmyard.plane.limits import RateLimiter, read_limited, retry_after_header
from swarmyard.plane.server import Listen, TlsFiles, check_listen, is_loopback


def test_token_bucket_refills_with_the_clock(clock: FakeClock) -> None:
    limiter = RateLimiter(2.0, 3, clock)
    for _ in range(3):
        limiter.acquire("w1")
    with pytest.raises(RateLimitedError) as caught:
        limiter.acquire("w1")
    assert caught.value.retry_after_s == pytest.approx(0.5)
    limiter.acquire("w2")  # buckets are per worker
    clock.advance(0.5)
    limiter.acquire("w1")
    with pytest.raises(RateLimitedError):
        limiter.acquire("w1")


def test_retry_after_rounds_up_to_whole_seconds() -> None:
    assert retry_after_header(0.01) == "1" and retry_after_header(1.2) == "2" and retry_after_header(3) == "3"


def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    return gen()


def test_body_limit_checks_declared_and_streamed_sizes() -> None:
    async def main() -> None:
        assert await read_limited(_chunks(b"ab", b"cd"), "4", 4) == b"abcd"
        with pytest.raises(PayloadTooLargeError):
            await read_limited(_chunks(b"x"), "5", 4)  # declared too large: refused before reading
        with pytest.raises(PayloadTooLargeError):
            await read_limited(_chunks(b"abc", b"de"), None, 4)  # chunked, over the limit

    anyio.run(main)


def test_tcp_beyond_loopback_requires_mutual_tls(tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    check_listen(Listen(socket_path=None, tcp_host="127.0.0.1"))
    with pytest.raises(UserError, match="mutual TLS"):
        check_listen(Listen(socket_path=tmp_path / "s.sock", tcp_host="0.0.0.0"))
    with pytest.raises(UserError, match="does not exist"):
        check_listen(Listen(socket_path=None, tcp_host="0.0.0.0",
                            tls=TlsFiles(tmp_path / "a", tmp_path / "b", tmp_path / "c")))
    with pytest.raises(UserError):
        check_listen(Listen(socket_path=None))


def test_certs_init_writes_a_working_chain_with_private_keys(tmp_path: Path) -> None:
    paths = init_certs(tmp_path / "certs", ["plane.internal", "10.1.2.3"], days=30)
    for path in vars_of(paths):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o600 if path.suffix == ".key" else 0o644), path
    server = x509.load_pem_x509_certificate(paths.server_cert.read_bytes())
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["plane.internal"]
    # the files load as a real mutual-TLS server context
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(paths.ca_cert))
    ctx.load_cert_chain(str(paths.server_cert), str(paths.server_key))
    ctx.load_cert_chain(str(paths.client_cert), str(paths.client_key))
    before = paths.ca_key.read_bytes()
    with pytest.raises(UserError, match="already holds"):
        init_certs(tmp_path / "certs", ["plane.internal"])
    assert paths.ca_key.read_bytes() == before
