"""`ServingBackend`: what every request of one server shares: the engine, the recipe's session definition and
chat protocol, what runs an agent-mode episode (`episodes`), whether the model takes images, the tools-mode
transcript store, the metrics, the trajectory log, and the overload gate.

It also turns a request's sampling fields into `SamplingParams` (the recipe's sampling, overridden field by
field). This module knows the runtime and the wire request; it knows nothing about HTTP routing.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Final

import msgspec
import structlog

from agent_protocol import ChatProtocol, VisionGrid, image_grid
from agent_runtime.engines.base import LLMEngine, SamplingParams
from agent_runtime.recipe import Recipe
from agent_runtime.serving.config import ServeConfig
from agent_runtime.serving.images import text_only_reason
from agent_runtime.serving.metrics import ServerMetrics
from agent_runtime.serving.openai_wire import ChatCompletionRequest
from agent_runtime.serving.transcript_store import ConversationStore, TranscriptStore
from agent_runtime.serving.turn_index import TurnIndex
from agent_runtime.session import AgentSession
from agent_runtime.trajectory import Trajectory, TrajectoryWriter

if TYPE_CHECKING:  # agent_mode imports this module
    from agent_runtime.serving.agent_mode import EpisodeSource

__all__ = ["ServingBackend", "new_completion_id"]

logger = structlog.get_logger(__name__)

_ID_HEX: Final = 24


def new_completion_id() -> str:
    """``chatcmpl-`` and 24 random hex digits (`os.urandom`: a fifth of `uuid4`'s cost, which made an object to
    cut up)."""
    return f"chatcmpl-{os.urandom(_ID_HEX // 2).hex()}"


class ServingBackend:
    """Shared state of a server. One event loop uses it."""

    def __init__(self, engine: LLMEngine, recipe: Recipe, config: ServeConfig) -> None:
        self.engine = engine
        self.recipe = recipe
        self.config = config
        self.session: AgentSession = recipe.make_session(engine.tokenizer)
        self.protocol: ChatProtocol = self.session.protocol
        #: why the served model takes no images (None: it takes them)
        self.text_only: str | None = text_only_reason(self.protocol, engine.tokenizer, engine)
        #: how the model cuts an image into pads (None: text-only); read once, since the check (a runtime
        #: Protocol's isinstance) cost every request about 10 us and the engine's tokenizer never changes
        self.image_grid: VisionGrid | None = image_grid(engine.tokenizer)
        self.store: ConversationStore
        if config.store == "memory" or config.transcript_store_conversations == 0:
            self.store = TranscriptStore(
                max_conversations=config.transcript_store_conversations,
                max_tokens=config.transcript_store_tokens,
                max_bytes=config.transcript_store_bytes,
                ttl_s=config.store_ttl_s,
            )
        else:  # replicas share it; the bounds are per entry, Redis's maxmemory bounds the whole
            from agent_runtime.serving.redis_store import RedisTranscriptStore

            self.store = RedisTranscriptStore(
                config.store,
                ttl_s=config.store_ttl_s,
                max_entry_tokens=config.transcript_store_tokens,
                max_entry_bytes=config.transcript_store_bytes,
            )
        #: where a tools-mode turn was stored, by its prompt: for a follow-up that rewrote that turn
        self.turn_index = TurnIndex(config.transcript_store_conversations)
        self.metrics = ServerMetrics()
        self.writer = TrajectoryWriter(config.trajectory_log) if config.trajectory_log else None
        self.model_ids = (config.model_name, *config.aliases)
        self.created = int(time.time())
        #: what opens an agent-mode request's episode (None: the recipe's own session, `agent_mode.SessionEpisodes`)
        self.episodes: EpisodeSource | None = None

    # -- the overload gate -------------------------------------------------------------------------------

    def try_enter(self) -> bool:
        """Take a slot for one chat completion; False when `max_concurrency` are already in flight."""
        metrics = self.metrics
        if metrics.in_flight >= self.config.max_concurrency:
            metrics.rejected_overloaded += 1
            return False
        metrics.in_flight += 1
        metrics.peak_in_flight = max(metrics.peak_in_flight, metrics.in_flight)
        return True

    def leave(self) -> None:
        self.metrics.in_flight -= 1

    # -- per request -------------------------------------------------------------------------------------

    @property
    def context_limit(self) -> int:
        """The most tokens a tools-mode conversation may hold (the engine's context, or the recipe's if smaller)."""
        limits = [x for x in (self.engine.context_length, self.recipe.max_context_tokens) if x]
        return min(limits)

    def sampling_for(self, request: ChatCompletionRequest) -> SamplingParams:
        """The recipe's sampling with the request's fields laid over it."""
        base = self.recipe.sampling
        changes: dict[str, object] = {}
        max_tokens = request.max_completion_tokens or request.max_tokens
        if max_tokens is not None:
            changes["max_new_tokens"] = max_tokens
        if request.temperature is not None:
            changes["temperature"] = request.temperature
        if request.top_p is not None:
            changes["top_p"] = request.top_p
        if request.top_k is not None:
            changes["top_k"] = request.top_k
        if request.seed is not None:
            changes["seed"] = request.seed
        return msgspec.structs.replace(base, **changes) if changes else base

    def record(self, trajectory: Trajectory) -> None:
        """Append one trajectory to the log (when there is one). A failing disk is logged, never raised.

        Synchronous on purpose (one small O_APPEND write): it runs in cleanup paths of cancelled requests too,
        where an await would be cancelled again."""
        if self.writer is None:
            return
        try:
            self.writer.write(trajectory)
        except OSError as e:
            logger.error("trajectory_write_failed", path=str(self.writer.path), error=str(e))
