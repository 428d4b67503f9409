import sys

from hami_agent.cli import main

sys.exit(main())
