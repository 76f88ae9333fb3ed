"""agent_runtime.serving: one agent behind an OpenAI-compatible HTTP API and a web chat page.

    from agent_runtime.serving import ServeConfig, create_app
    app = create_app(engine, recipe, ServeConfig(model_name="my-agent", api_key="secret"))
    uvicorn.run(app, host="127.0.0.1", port=8000)

`POST /v1/chat/completions` without `tools` runs the recipe's whole episode server-side (agent mode); with `tools`
it is one model turn that returns `tool_calls` for the client to run, token-in-token-out across follow-ups (tools
mode). `POST /v1/responses` is the Responses API on that same tools-mode turn (`responses_api.py`). See `app.py`
for the routes and errors, `openai_wire.py` for the wire format and its extensions
(`agent_event` on stream chunks, `agent` on completions). `create_viewer_app(path)` serves the trajectory viewer
alone over trajectory files (`trajectory_viewer.py`); a served agent has it at ``/viewer`` over its log.

A separate import from `agent_runtime`: it needs the `serve` extra (Starlette, uvicorn); `import agent_runtime`
never imports a web framework.
"""

from agent_runtime.serving.api_error import ApiError
from agent_runtime.serving.app import create_app
from agent_runtime.serving.backend import ServingBackend
from agent_runtime.serving.config import ServeConfig, ServeConfigError
from agent_runtime.serving.metrics import ServerMetrics
from agent_runtime.serving.openai_wire import (
    AGENT_EVENT_FIELD,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
)
from agent_runtime.serving.ray_replicas import REPLICA_HEADER, RayServeMissing, require_ray_serve, serve_replicas
from agent_runtime.serving.redis_store import RedisTranscriptStore, check_store
from agent_runtime.serving.trajectory_files import TrajectoryFiles, TrajectoryFilesError, TrajectoryFilter
from agent_runtime.serving.trajectory_viewer import create_viewer_app
from agent_runtime.serving.transcript_store import (
    ConversationStore,
    StoredConversation,
    StoreUnavailable,
    TranscriptStore,
    conversation_key,
)

__all__ = [
    "AGENT_EVENT_FIELD",
    "REPLICA_HEADER",
    "ApiError",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ConversationStore",
    "RayServeMissing",
    "RedisTranscriptStore",
    "ServeConfig",
    "ServeConfigError",
    "ServerMetrics",
    "ServingBackend",
    "StoreUnavailable",
    "StoredConversation",
    "TrajectoryFiles",
    "TrajectoryFilesError",
    "TrajectoryFilter",
    "TranscriptStore",
    "check_store",
    "conversation_key",
    "create_app",
    "create_viewer_app",
    "require_ray_serve",
    "serve_replicas",
]
