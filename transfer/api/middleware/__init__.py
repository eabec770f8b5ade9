"""The ASGI middleware every request passes, outermost first, before any route runs (wired in
:func:`transfer.api.app.create_app`):

- :mod:`.observability`: request id, Prometheus metrics, the JSON access log, readiness and the in-flight set a
  graceful shutdown waits for; outermost, so refusals are counted and logged too.
- :mod:`.trust`: the trust boundary (Host allow-list against forged hosts and DNS rebinding, cross-site browser
  requests refused).
- :mod:`.limits`: request header size, control-plane JSON body size, and the minimum body rate (:class:`MinRate`)
  the server's protocol (:mod:`transfer.api.protocol`) holds every body to.

Middleware refuses or annotates requests; it holds no business rule (those live in :mod:`transfer.service`).
"""
