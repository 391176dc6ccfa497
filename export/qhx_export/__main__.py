"""`python -m qhx_export ARGS...` is `qhx-export ARGS...`."""

import sys

from qhx_export.cli import main

sys.exit(main())
