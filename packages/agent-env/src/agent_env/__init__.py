"""agent-env: environments (`Environment`, `FunctionCallEnvironment`, `SingleTurnEnvironment`), tools (`ToolBase` and the built-ins) and reward pipelines.

This layer is being built (see the project's issues); today it only declares its place in the stack.
"""

from importlib.metadata import version as _version

__all__ = ["__version__"]

__version__ = _version("agent-env")
