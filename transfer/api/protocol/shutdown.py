"""Graceful shutdown of ``transfer serve``: what happens between SIGTERM and the process's exit.

1. SIGTERM: the service starts draining. ``/readyz`` answers 503 at once and every response asks its client to
   close the connection, while new connections are still accepted for ``shutdown_drain`` seconds (a load balancer
   needs a few probe periods to stop sending traffic; refusing connections first would fail requests it still
   routes here).
2. Then the listening socket closes (uvicorn's shutdown) and requests in flight may finish, until
   ``shutdown_grace`` seconds after SIGTERM.
3. Requests still running then are stopped: each sees its client leave (``http.disconnect``), so an upload aborts
   exactly as for a vanished client (local: its temporary file removed; S3: its multipart upload aborted; nothing
   published) and the client gets a JSON 503 ``shutting_down`` if it is still there. The service then closes
   (lifespan shutdown) and the process exits 0.

SIGINT (Ctrl-C) skips the drain; a second signal stops waiting. The process exits 0 after a signal: uvicorn would
re-raise the signal once it is done, which makes the exit status 128+15, a failure to a supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from types import FrameType

import uvicorn

from transfer.api.middleware.observability import Observability

log = logging.getLogger("transfer.ops")

STOP_WAIT = 10.0  # seconds stopped requests get to finish aborting (S3: AbortMultipartUpload) before uvicorn cancels


class GracefulServer(uvicorn.Server):
    """uvicorn's server with the drain, grace and stop of the module docstring."""

    def __init__(self, config: uvicorn.Config, obs: Observability, *, drain: float, grace: float) -> None:
        # uvicorn's own deadline becomes a backstop behind ours
        config.timeout_graceful_shutdown = int(grace + STOP_WAIT + 5)
        super().__init__(config)
        self.obs = obs
        self.drain = drain
        self.grace = grace
        self._exit_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # deliberately not recorded in self._captured_signals: uvicorn would re-raise it at exit (status 143)
        if self._exit_at is not None or self.should_exit:
            if self.should_exit:
                self.force_exit = True  # a second signal during shutdown: stop waiting
            self.should_exit = True
            return
        self.obs.start_draining()
        self._exit_at = time.monotonic() + (min(self.drain, self.grace) if sig == signal.SIGTERM else 0.0)

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        return self._exit_at is not None and time.monotonic() >= self._exit_at

    async def _wait_tasks_to_complete(self) -> None:
        """Wait for requests in flight until the grace ends, then stop them and wait for their aborts."""
        began = self.obs.draining_since if self.obs.draining_since is not None else time.monotonic()
        remaining = max(0.0, self.grace - (time.monotonic() - began))
        try:
            async with asyncio.timeout(remaining):
                await super()._wait_tasks_to_complete()
            return
        except TimeoutError:
            pass
        stopped = self.obs.stop_in_flight()
        log.warning("shutdown grace (%g s) ended: stopped %d request(s) still running", self.grace, stopped)
        try:
            async with asyncio.timeout(STOP_WAIT):
                await super()._wait_tasks_to_complete()
        except TimeoutError:
            log.error(
                "%d request(s) did not stop within %g s; cancelling them", len(self.server_state.tasks), STOP_WAIT
            )
