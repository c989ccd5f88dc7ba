"""The reliability checks (``reliability/`` at the repository root) at CI size.

Each test module runs its checks once (module-scoped fixtures) against real services and
asserts on the rows they return; ``python -m reliability`` runs the same checks and writes
``docs/reliability.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
