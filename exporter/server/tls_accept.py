"""TLS handshakes the server sees: each new connection on the TLS port upgraded with ``loop.start_tls``.

asyncio's own TLS server (``create_server(ssl=...)``) drops a connection whose handshake failed and
says so only in debug mode: plain HTTP on the TLS port, an untrusted client certificate or a scanner
left no trace. Here the handshake is asyncio's all the same (``start_tls``, the same context and its
certificate reloads), but one that fails is handed to ``failed`` (the server counts it and logs one
line a minute) before the connection closes. :func:`handshake_reason` names a failure in a few words.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

# The client went away before or during its hello: a port probe or a scanner, nothing to tell.
CLOSED = (ssl.SSLEOFError, ConnectionResetError, BrokenPipeError, EOFError)


def handshake_reason(exc: BaseException) -> str:
    """A failed handshake in a few words: OpenSSL's reason (``WRONG_VERSION_NUMBER``), a timeout, a reset."""
    if isinstance(exc, ssl.SSLError):
        return exc.reason or exc.__class__.__name__
    if isinstance(exc, TimeoutError):
        return "not completed in time"
    return type(exc).__name__


class TlsAccept(asyncio.Protocol):
    """A TCP connection on the TLS port until its handshake ended; then ``make()``'s protocol takes it."""

    def __init__(self, make: Callable[[], asyncio.Protocol], context: ssl.SSLContext, timeout: float,
                 failed: Callable[[str, BaseException], None], loop: asyncio.AbstractEventLoop) -> None:
        self._make, self._context, self._timeout, self._failed, self._loop = make, context, timeout, failed, loop
        self._task: asyncio.Task[None] | None = None
        self.remote = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # the ClientHello waits for start_tls, which reads it
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self._task = self._loop.create_task(self._handshake(transport))

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()  # closed before start_tls took it over

    async def _handshake(self, transport: asyncio.Transport) -> None:
        held = _Held()  # the request may arrive with the handshake's end, before this coroutine resumes
        try:
            tls = await self._loop.start_tls(transport, held, self._context, server_side=True,
                                             ssl_handshake_timeout=self._timeout)
        except asyncio.CancelledError:
            transport.close()
            raise
        except (OSError, EOFError, RuntimeError) as e:  # ssl.SSLError and TimeoutError are OSErrors
            transport.close()
            if not isinstance(e, CLOSED):  # a TCP probe (the chart's tcpSocket) connects and closes: no failure
                self._failed(self.remote, e)
            return
        if tls is None:  # the transport closed meanwhile
            transport.close()
            return
        conn = self._make()
        tls.set_protocol(conn)
        conn.connection_made(tls)
        held.hand_on(conn)


class _Held(asyncio.Protocol):
    """The TLS connection's protocol from its handshake's end until the HTTP connection takes it."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.eof = False
        self.lost: tuple[BaseException | None] | None = None

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool | None:
        self.eof = True
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = (exc,)

    def hand_on(self, conn: asyncio.Protocol) -> None:
        """Give ``conn`` (now the connection's protocol) what arrived meanwhile, in order."""
        if self.data:
            conn.data_received(b"".join(self.data))
        if self.eof:
            conn.eof_received()
        if self.lost is not None:
            conn.connection_lost(self.lost[0])
