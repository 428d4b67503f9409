"""``python -m benchmarks.chaos`` = ``python -m benchmarks chaos``."""

import sys

from benchmarks.chaos.bench import main

sys.exit(main())
