"""``python -m genaug.service``: the same as ``genaug serve``."""

from __future__ import annotations

import sys

from genaug.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
