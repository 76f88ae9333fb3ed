"""`ServerMetrics`: the server's counters, served as JSON at `GET /metrics`.

Requests by mode and outcome, the overload gate and the body budget, the agent episodes' tool calls and
compactions, and how tools-mode follow-ups were prepared: `transcript_prefix_hits` (the conversation extended a
stored transcript; only the new messages were tokenized, `reused_prompt_tokens` counts the ids taken over as they
were), `transcript_rerenders` (the conversation had earlier assistant turns but matched no stored transcript, so
it was rendered from scratch; `transcript_rerenders_store_unavailable` counts those among them whose store could
not be reached, `transcript_store_put_failures` the turns a store could not keep) and `transcript_new` (a first
turn, rendered from scratch by nature); `transcript_rollbacks` counts the follow-ups that rewrote the last
assistant turn of a stored transcript, continued from that turn's start (`tools_mode`). One event loop updates
it; no locks.
"""

from __future__ import annotations

import msgspec

__all__ = ["ServerMetrics"]


class ServerMetrics(msgspec.Struct, kw_only=True):
    requests: int = 0
    requests_agent: int = 0
    requests_tools: int = 0
    requests_streamed: int = 0
    completed: int = 0
    client_errors: int = 0  # answered 4xx (bad request, unknown model, bad key); overload counted apart
    server_errors: int = 0  # the engine, a tool environment or the server failed mid-request
    rejected_overloaded: int = 0  # 429: max_concurrency requests were in flight
    rejected_body_budget: int = 0  # 429: the bodies being read held max_buffered_request_bytes
    client_disconnects: int = 0  # 499: the client hung up (its completion cancelled, its engine call aborted)
    in_flight: int = 0
    peak_in_flight: int = 0
    episodes: int = 0
    tool_calls: int = 0
    compactions: int = 0
    transcript_prefix_hits: int = 0
    transcript_rerenders: int = 0
    transcript_rollbacks: int = 0
    transcript_rerenders_store_unavailable: int = 0
    transcript_store_put_failures: int = 0
    transcript_new: int = 0
    reused_prompt_tokens: int = 0
    rendered_prompt_tokens: int = 0
    generated_tokens: int = 0
