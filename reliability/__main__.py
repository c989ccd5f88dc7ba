"""``python -m reliability``: see :mod:`reliability.run`."""

from __future__ import annotations

import sys

from .run import main

sys.exit(main())
