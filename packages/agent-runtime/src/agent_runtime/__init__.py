"""agent-runtime: the one loop that training and serving both run.

`AgentSession` owns the episode: prompt rendering, the token-in-token-out transcript,
parsing, environment steps, rewards and budgets. `LLMEngine` is the model backend (`make_engine("hf" | "vllm" |
"openai" | "scripted", ...)`; heavy backends are imported only when used). `AgentRuntime` drives sessions with an
engine and streams typed events. A `ContextPolicy` (`Recipe.context`: `BudgetPolicy`, `CompactionPolicy` or one's
own) decides what an episode does as its context grows. `Trajectory` is the record both serving and training keep.
"""

from importlib.metadata import version as _version

from agent_runtime.agent_program import PROGRAM_CODES, AgentProgram, ProgramCommand, ProgramSync, ProgramTask
from agent_runtime.boundary import StageError, boundary
from agent_runtime.compaction import CompactableSession
from agent_runtime.context_policy import (
    CONTINUE,
    BudgetPolicy,
    CompactionPolicy,
    ContextDecision,
    ContextPolicy,
    ContextView,
    Continue,
    End,
    NewSegment,
    Summarize,
)
from agent_runtime.engines.base import FinishReason, Generation, LLMEngine, SamplingParams
from agent_runtime.engines.scripted import ScriptedEngine
from agent_runtime.errors import (
    ContextBudgetExceeded,
    EngineBadOutput,
    EngineError,
    EngineUnavailable,
    RuntimeAgentError,
    SessionStateError,
)
from agent_runtime.events import (
    AssistantEvent,
    CompactionEvent,
    ErrorEvent,
    Event,
    FinalEvent,
    ToolCallEvent,
    ToolResultEvent,
    event_to_dict,
)
from agent_runtime.model_recipe import recipe_for_model
from agent_runtime.outcomes import ERROR_CODES, EndingCode
from agent_runtime.recipe import Compaction, Recipe, RecipeError, iter_jsonl, load_recipe
from agent_runtime.runtime import AgentRuntime, RunResult
from agent_runtime.session import AgentSession, StepOutcome, TurnRequest
from agent_runtime.torch_warnings import ignore_pynvml_deprecation
from agent_runtime.trajectory import (
    EpisodeError,
    Trajectory,
    TrajectoryReadError,
    TrajectoryWriter,
    Usage,
    build_trajectory,
    read_trajectories,
    usage_of,
)

__all__ = [
    "CONTINUE",
    "ERROR_CODES",
    "PROGRAM_CODES",
    "AgentProgram",
    "AgentRuntime",
    "AgentSession",
    "AssistantEvent",
    "BudgetPolicy",
    "CompactableSession",
    "Compaction",
    "CompactionEvent",
    "CompactionPolicy",
    "ContextBudgetExceeded",
    "ContextDecision",
    "ContextPolicy",
    "ContextView",
    "Continue",
    "End",
    "EndingCode",
    "EngineBadOutput",
    "EngineError",
    "EngineUnavailable",
    "EpisodeError",
    "ErrorEvent",
    "Event",
    "FinalEvent",
    "FinishReason",
    "Generation",
    "LLMEngine",
    "NewSegment",
    "ProgramCommand",
    "ProgramSync",
    "ProgramTask",
    "Recipe",
    "RecipeError",
    "RunResult",
    "RuntimeAgentError",
    "SamplingParams",
    "ScriptedEngine",
    "SessionStateError",
    "StageError",
    "StepOutcome",
    "Summarize",
    "ToolCallEvent",
    "ToolResultEvent",
    "Trajectory",
    "TrajectoryReadError",
    "TrajectoryWriter",
    "TurnRequest",
    "Usage",
    "__version__",
    "boundary",
    "build_trajectory",
    "event_to_dict",
    "ignore_pynvml_deprecation",
    "iter_jsonl",
    "load_recipe",
    "read_trajectories",
    "recipe_for_model",
    "usage_of",
]

__version__ = _version("agent-runtime")
