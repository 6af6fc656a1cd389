"""The perdure.tools package: its public names and what it may import."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import perdure.tools

EXPECTED = {
    "AgentTool",
    "DecoratedTool",
    "Interrupt",
    "InterruptException",
    "PythonAgentTool",
    "ToolContext",
    "ToolRegistry",
    "error_result",
    "interrupt_id",
    "to_tool_result",
    "tool",
}
ALLOWED_PERDURE = ("perdure.types", "perdure.state", "perdure.errors", "perdure.tools")


def test_all_is_sorted_and_complete() -> None:
    assert perdure.tools.__all__ == sorted(perdure.tools.__all__)
    assert set(perdure.tools.__all__) == EXPECTED
    for name in perdure.tools.__all__:
        assert getattr(perdure.tools, name) is not None


def test_imports_only_the_standard_library_and_lower_layers() -> None:
    package = Path(perdure.tools.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top == "perdure":
                    assert module.startswith(ALLOWED_PERDURE), f"{path.name} imports {module}"
                else:
                    assert top in sys.stdlib_module_names or top == "__future__", (
                        f"{path.name} imports {module}"
                    )
