"""``python -m planner.runtime``: one rank of a plan's run (launch with torchrun).

The rank leaves through ``os._exit`` (``planner.runtime.lifecycle.leave``) once its work is
done and written: the interpreter's teardown of torch and its threads took seconds on a busy
machine, time in which torchrun, seeing a peer fail, was already signalling this rank.
"""

from planner.runtime.lifecycle import leave
from planner.runtime.main import main

leave(main())
