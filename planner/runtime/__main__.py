"""``python -m planner.runtime``: one rank of a plan's run (launch with torchrun)."""

import sys

from planner.runtime.main import main

sys.exit(main())
