import sys

from transfer.cli import main

sys.exit(main())
