"""The server's listening socket turns Nagle's algorithm off on every connection.

With it on, each keep-alive response after a connection's first, and each streamed
chunk, waited about 40 ms for the client's delayed ACK: uvicorn writes a response's
headers and body apart. asyncio disables Nagle only on sockets that name IPPROTO_TCP,
which `socket.create_server` does not."""

from __future__ import annotations

import asyncio
import socket

import pytest

from accord.cli.launcher import listen_tcp


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_connections_accepted_by_asyncio_on_the_listener_have_nagle_off(host: str) -> None:
    if host == "::1" and not socket.has_ipv6:
        pytest.skip("this host has no IPv6")

    async def accepted_connection_nodelay() -> int:
        nodelay: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nodelay.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        with listen_tcp(host, 0) as listener:
            server = await asyncio.start_server(on_connection, sock=listener)
            async with server:
                _, writer = await asyncio.open_connection(host, listener.getsockname()[1])
                try:
                    return await asyncio.wait_for(nodelay, 30)
                finally:
                    writer.close()

    assert asyncio.run(accepted_connection_nodelay()) != 0


def test_a_port_in_use_is_refused() -> None:
    with listen_tcp("127.0.0.1", 0) as taken, pytest.raises(OSError):
        listen_tcp("127.0.0.1", taken.getsockname()[1])
