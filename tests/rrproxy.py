"""A round-robin TCP proxy on loopback: each new connection goes to the next backend in turn, bytes pass unchanged.

With a client that opens one connection per request (keep-alive off), consecutive requests alternate between the
backends, as behind a load balancer that knows nothing of the application. ``routed`` records which backend each
connection went to.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

PIECE = 1 << 16


class RoundRobinProxy:
    def __init__(self, backends: list[tuple[str, int]]) -> None:
        self.backends = backends
        self.routed: list[int] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RoundRobinProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0.05)  # the closed transports finish closing

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        which = len(self.routed) % len(self.backends)
        self.routed.append(which)
        host, port = self.backends[which]
        up_writer = None
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except OSError:
            pass
        finally:
            writer.close()
            if up_writer is not None:
                up_writer.close()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(PIECE):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # a half-close is passed on, not turned into a reset
        except OSError:
            writer.close()
