import sys

from benchmarks.e2e import main

sys.exit(main())
