"""``python -m cli`` is the ``inflight`` command."""

import sys

from cli.main import main

sys.exit(main())
