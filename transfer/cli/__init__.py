"""The ``transfer`` command: serve, upload, resolve, inspect.

Every failure prints one line, ``transfer: <code>: <message>``, on stderr and exits non-zero (2 for usage errors,
1 otherwise). Settings come from flags, then ``TRANSFER_*`` environment variables (see ``transfer.settings``).

One module per command group: ``serve`` (serve, mcp), ``storage`` (storage check), ``upload`` (upload, bundle),
``resolve`` (resolve, inspect), ``listing`` (ls, usage, session), ``admin`` (files, usage repair, gc), ``keys``,
``bench``; ``console`` holds what they share and ``main`` the parser and the entry point.
"""

from transfer.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
