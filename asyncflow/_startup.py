"""What was loaded before asyncflow: imported first by ``asyncflow/__init__.py``."""

import sys

#: the modules loaded before asyncflow's own: ``asyncflow run`` tells which of the others a
#: module of the program would have replaced, run plainly
MODULES_BEFORE = frozenset(sys.modules)
