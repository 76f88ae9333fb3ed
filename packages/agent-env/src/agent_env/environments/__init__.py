"""The environments that ship with agent-env, one module each."""

from agent_env.environments.function_call import FunctionCallEnvironment
from agent_env.environments.single_turn import SingleTurnEnvironment

__all__ = ["FunctionCallEnvironment", "SingleTurnEnvironment"]
