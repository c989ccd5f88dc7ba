"""docs/deploy.md's Python snippets parse, and the conversion it shows is the command."""

from __future__ import annotations

import ast
import re

from _docker_files import (
    ROOT,
)

# --- docs -----------------------------------------------------------------------------------


def test_deploy_doc_python_snippets_parse_and_conversion_is_the_command() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert blocks, "docs/deploy.md has no python snippet"
    for block in blocks:
        ast.parse(block)
    # A fine-tuned .pt is converted by the one command that may unpickle, never by a snippet
    # readers would copy with weights_only=False.
    assert "genaug convert-unet" in doc and "--trust-this-file" in doc
    assert "weights_only=False" not in "\n".join(blocks)
