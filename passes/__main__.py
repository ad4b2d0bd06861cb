"""``python -m passes`` is the ``optimize`` command."""

from __future__ import annotations

import sys

from passes.cli import main

sys.exit(main())
