import sys

from planner.commands.cli import main

sys.exit(main())
