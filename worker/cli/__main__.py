"""``python -m worker.cli`` is the ``inflight`` command."""

import sys

from worker.cli.main import main

sys.exit(main())
