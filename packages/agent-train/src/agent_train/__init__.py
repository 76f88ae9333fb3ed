"""agent-train: the OpenRLHF glue: the agent executor for `--train.agent_func_path`, recipes, the launcher and
the local trainer.

This layer is being built (see the project's issues); today it only declares its place in the stack.
"""

from importlib.metadata import version as _version

__all__ = ["__version__"]

__version__ = _version("agent-train")
