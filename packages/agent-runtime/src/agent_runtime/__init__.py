"""agent-runtime: `AgentSession`, `CompactableSession`, the LLM engines (hf, vllm, openai, scripted) and
`AgentRuntime`.

This layer is being built (see the project's issues); today it only declares its place in the stack.
"""

from importlib.metadata import version as _version

__all__ = ["__version__"]

__version__ = _version("agent-runtime")
