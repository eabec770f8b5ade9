"""``python -m transfer.cli``: the command line, as ``transfer`` and ``python -m transfer`` run it."""

import sys

from transfer.cli import main

sys.exit(main())
