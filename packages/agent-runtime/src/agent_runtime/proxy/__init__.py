"""agent_runtime.proxy: train an agent written against the OpenAI API, token-exact.

    from agent_runtime.proxy import run_program
    episode = await run_program(recipe, engine, ProgramTask(prompt=row["prompt"], row=row), sampling=sampling)

A recipe with `agent=AgentProgram(fn)` (`agent_runtime.agent_program`) names an async function
``agent(client, task) -> answer``. Each episode gets its own in-process tools-mode endpoint on the rollout engine
(`endpoint.py`, `episode_engine.py`); every request is recorded by its transcript (`request_log.py`): sampled ids
kept as sampled, feedback tokenized alone, loss mask on generated tokens only. A client that rewrites its
history gets the fixed rule of its edit kind (`prefix_break.py`: a plain or reasoning-stripped echo continues,
a rewritten last turn is rolled back and continued, anything else opens a new segment, with the reason), and
each kind is counted per episode. `program_thread.py` runs the program on a thread
and an event loop of its own under its time budget and caps, its requests handed to the endpoint on the rollout's
loop; `episode.py` turns what it did into the episode and scores it.

A program in another process, or any client that takes only a base URL, reaches its episode through the rollout
worker's listening `Gateway` (`gateway.py`: one uvicorn server, a session per episode with its own key and
``/sessions/{id}/v1`` base URL, ``/end`` and ``/reward`` routes), which hands each request to the same
`EpisodeEndpoint`. A command program (`AgentProgram.command`) is such a process, started per episode by
`program_process.py` with ``OPENAI_BASE_URL``/``OPENAI_API_KEY``/``OPENAI_MODEL`` set; function programs keep the
in-process hand-off (no port, no HTTP encoding). `run_program(..., gateway=...)` takes the worker's gateway:
`WorkerGateway` (`worker_gateway.py`) starts it on the worker's loop when first needed, with its address from
``AGENT_GATEWAY_HOST``/``AGENT_GATEWAY_PORT``/``AGENT_GATEWAY_ADVERTISED_HOST`` (loopback, an ephemeral port by
default), and stops it when the worker closes or exits.

Served: `ProgramEpisodes` (`served_program.py`) is agent mode for such a recipe (`create_app(episodes=...)`, which
`apps/serve --recipe` passes for a program recipe): each chat completion without `tools` runs the program once on
the server's engine, its turns streamed live as agent events, its answer the completion's.

A separate import from `agent_runtime`: it needs the `serve` extra (Starlette, uvicorn) and the `openai` client.
"""

from agent_runtime.proxy.endpoint import EpisodeEndpoint
from agent_runtime.proxy.episode import ProgramEpisode, ProgramOutcome, run_program
from agent_runtime.proxy.episode_engine import EpisodeEngine
from agent_runtime.proxy.gateway import Gateway, GatewayError, GatewaySession
from agent_runtime.proxy.prefix_break import (
    BREAK_REASONS,
    EDIT_KINDS,
    EDIT_RULES,
    BreakReason,
    EditKind,
    EditRule,
    PrefixBreak,
    diagnose,
)
from agent_runtime.proxy.request_log import RequestLog, Segment
from agent_runtime.proxy.served_program import ProgramEpisodes, ServedProgram
from agent_runtime.proxy.worker_gateway import GATEWAY_ENV, WorkerGateway

__all__ = [
    "BREAK_REASONS",
    "EDIT_KINDS",
    "EDIT_RULES",
    "GATEWAY_ENV",
    "BreakReason",
    "EditKind",
    "EditRule",
    "EpisodeEndpoint",
    "EpisodeEngine",
    "Gateway",
    "GatewayError",
    "GatewaySession",
    "PrefixBreak",
    "ProgramEpisode",
    "ProgramEpisodes",
    "ProgramOutcome",
    "RequestLog",
    "Segment",
    "ServedProgram",
    "WorkerGateway",
    "diagnose",
    "run_program",
]
