"""``python -m flows.cli``: the ``kpca`` command."""

import sys

from . import main

sys.exit(main())
