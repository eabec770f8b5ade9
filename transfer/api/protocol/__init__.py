"""The HTTP server's own protocol work: what ``transfer serve`` adds to uvicorn (and Hypercorn's h2) below ASGI.

Nothing here is a route or a middleware; every module exists because the server, as shipped, cannot do something
the service promises, and ASGI gives an application no way to do it itself. The chain is one subclass per concern,
each on top of the previous one, so a request on HTTP/1.1 runs through
``HeadTimeoutProtocol(InformationalProtocol(BodyProtocol(uvicorn's HttpToolsProtocol)))``:

- :mod:`.bodyread` (``BodyProtocol``, ``BodyCycle``): request bodies reach the application as the socket's own
  reads, without uvicorn's three copies per byte and its 64 KiB read stops; the rest of a body answered early is
  drained under a minimum rate (RFC 9112 §9.6) instead of with no deadline.
- :mod:`.informational` (``InformationalProtocol``): the ASGI extension ``http.response.informational``, so the
  IETF resumable upload can send ``104 Upload Resumption Supported`` (uvicorn writes only ``100 Continue``).
- :mod:`.server` (``HeadTimeoutProtocol``, ``TPWebSocketProtocol``, ``BodyRateGuard``, ``uvicorn_config``): a
  deadline and a size limit on the request head (uvicorn has neither: slowloris, and httptools keeps a head of any
  size), the Host rule of RFC 9112 §3.2, a send timeout on every response, slow bodies shed, TP's WebSocket
  ping/pong rule (§9.2.2: two missed pongs close with 1008, uvicorn's rule is one miss -> 1011), and the one
  uvicorn configuration shared by ``transfer serve``, the tests and the benchmarks.
- :mod:`.zerocopy`: the ASGI ``http.response.zerocopysend`` extension (``sendfile(2)``; uvicorn offers none and
  uvloop has no ``loop.sendfile``), so a download's bytes never enter the process; under the send timeout too.
- :mod:`.shutdown` (``GracefulServer``, a ``uvicorn.Server``): drain on SIGTERM (``/readyz`` 503 first, then the
  listener closes, then requests in flight see ``http.disconnect``), which uvicorn's own shutdown does not stage.
- :mod:`.admission` (``ConnectionLimits``): connections per process and per client address, answered
  ``503 too_many_connections`` in their own protocol past a limit; addresses penalised after HTTP/2 abuse.
- :mod:`.http2` (``ListenerProtocol``, ``H2Connection``): the listener that admits each connection and routes it to
  HTTP/2 (by ALPN, or by prior knowledge) or HTTP/1.1, and the socket side of an HTTP/2 connection.
- :mod:`.h2protocol` (``FlowControlledH2``), :mod:`.h2streams`, :mod:`.h2guard`: Hypercorn's h2 protocol with
  per-stream flow control, interim responses, ``REFUSED_STREAM`` past the stream limit and while draining, bounded
  response buffers with a send timeout, and the per-connection bounds of frames, header blocks, resets and control
  frames (``GOAWAY(ENHANCE_YOUR_CALM)``). The figures: ``docs/SECURITY.md`` "Connection limits".
- :mod:`.tls` (``ListenerTLS``): the listener's ``SSLContext`` (modern defaults, ALPN ``h2``/``http/1.1``),
  reloaded on SIGHUP without dropping open connections.

Tested against: uvicorn 0.54 (``uvicorn[standard]>=0.54,<0.55`` in ``pyproject.toml``; 0.54.0 with httptools 0.9
and uvloop 0.23 installed) and Hypercorn 0.18 (``>=0.18,<0.19``; 0.18.0 with h2 4.4). The subclasses build on
private classes of both (``uvicorn.protocols.http.httptools_impl``, ``uvicorn.protocols.websockets.
websockets_sansio_impl``, ``hypercorn.protocol.h2``), so the pins are upper-bounded on purpose: raise them only
after ``tests/http/test_body_read.py``, ``test_body_smuggling.py``, ``test_zero_copy.py``, ``test_resumable.py``,
``test_slow_clients.py``, ``test_observability.py`` (shutdown), ``test_http2.py`` and ``tests/edge/`` pass on the new
version (``tests/http/test_protocol_pins.py`` fails when the installed versions leave the range named here).
"""

# the versions this package's subclasses were written and tested against (see the docstring): [low, high)
UVICORN_TESTED = ("0.54", "0.55")
HYPERCORN_TESTED = ("0.18", "0.19")
