"""`AgentExecutor`: a recipe's agent as an OpenRLHF agent executor (`--train.agent_func_path`).

    executor = AgentExecutor("recipes/calculator.py")
    sample = await executor.execute(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine)

OpenRLHF calls `execute` once per rollout, inside its vLLM rollout actor, and trains on the dict it returns.
The episode is not re-implemented here: `execute` wraps OpenRLHF's rollout engine in `OpenRLHFEngine` and runs
the recipe's session with `AgentRuntime`, the same loop `apps/serve` runs, so prompt rendering, token-in-token-out
transcripts, parsing, tools, rewards, budgets and compaction are the serving code's, byte for byte. The finished
`Trajectory` becomes one record per segment (`segment_samples`, see `sample.py`), and OpenRLHF gets them as one
dict (`openrlhf_segments.episode_record`): the last segment's, the earlier ones under ``agent_segments`` for the
segment extension the launcher installs, which trains every segment with the episode's advantage; an episode that
ran out of budget without answering carries ``agent_overlong``. A plain episode's dict is OpenRLHF's own format,
nothing added.

`max_length` is OpenRLHF's `--data.max_len`, the most tokens a trained sequence holds: it caps the session's
context, so each turn gets at most what is left of it (OpenRLHF's own executor does the same), the episode ends
cleanly (``context_exhausted``) when nothing is left, and a compacting recipe compacts against it: OpenRLHF
passes the same `max_length` to every sample, so every sample of a group compacts at the same token threshold
(the recipe's `compact_at_tokens`, else 3/4 of it). A model,
tool or engine failure never raises out of `execute`: it is recorded, scored and counted in `extra_logs`.

A recipe that names an agent program (`Recipe.agent`) runs that program instead, against a per-episode OpenAI
endpoint on the same engine (`agent_train.program_rollout`, `agent_runtime.proxy`); its segments (one per
conversation continued token-exactly, a new one at each prefix break) come back the way a compacted episode's do.

`rollout()` is the same episode for callers outside OpenRLHF (the local trainer): it takes any `LLMEngine` and
returns the whole `Trajectory` with its segment records. OpenRLHF constructs its executor with no arguments;
`agent_train/openrlhf_agent.py` is that no-argument class, reading the recipe from ``AGENT_RECIPE``.
This module imports OpenRLHF (for the base class), hence torch; the package root does not import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import structlog
from openrlhf.utils.agent import AgentExecutorBase

from agent_protocol import HFTokenizer, Tokenizer, load_tokenizer
from agent_runtime import AgentRuntime, AssistantEvent, LLMEngine, SamplingParams, Trajectory
from agent_runtime.recipe import Recipe, load_recipe
from agent_train.openrlhf_engine import OpenRLHFEngine
from agent_train.openrlhf_segments import episode_record
from agent_train.sample import RolloutSample, segment_samples
from agent_train.task import decode_task

__all__ = ["AgentExecutor", "Rollout", "as_tokenizer"]

logger = structlog.get_logger(__name__)


class Rollout(msgspec.Struct, frozen=True, kw_only=True):
    """One episode: the full `trajectory`, one record per segment (`segments`, in order) and the last of them
    (`sample`, what OpenRLHF trains without the segment extension)."""

    trajectory: Trajectory
    sample: RolloutSample
    segments: list[RolloutSample] = msgspec.field(default_factory=list)


class AgentExecutor(AgentExecutorBase):  # type: ignore[misc]  # OpenRLHF is untyped
    """Runs a recipe's episodes for OpenRLHF. `engine_timeout_s` bounds one generation (None: no bound, as in
    OpenRLHF's own executors; a generation that times out ends only its episode, as ``engine_timeout``)."""

    def __init__(self, recipe: Recipe | str | Path, *, engine_timeout_s: float | None = None) -> None:
        self.recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
        self.engine_timeout_s = engine_timeout_s
        self._definition = self.recipe.make_session()  # spawned per episode; the engine's tokenizer is bound then
        logger.info("agent_executor_ready", recipe=self.recipe.name, protocol=self._definition.protocol.name)

    async def execute(
        self,
        prompt: Any,
        label: Any,
        sampling_params: Any,
        max_length: int,
        hf_tokenizer: Any,
        llm_engine: Any,
        images: Any = None,
    ) -> dict[str, Any]:
        """OpenRLHF's entry point: one episode on `prompt`, returned as the dict OpenRLHF consumes."""
        if images:
            raise ValueError(f"recipe {self.recipe.name!r} is text-only; this dataset row carries images")
        tokenizer = as_tokenizer(hf_tokenizer)
        stops = (tokenizer.token_to_id(text) for text in self._definition.protocol.stop_texts)
        engine = OpenRLHFEngine(
            llm_engine,
            tokenizer,
            sampling_params,
            context_length=int(max_length),
            stop_token_ids=tuple(i for i in stops if i is not None),
        )
        rollout = await self.rollout(
            prompt, label, engine, max_length=int(max_length), with_logprobs=engine.with_logprobs
        )
        return episode_record(rollout.segments)

    async def rollout(
        self,
        prompt: Any,
        label: Any,
        engine: LLMEngine,
        *,
        max_length: int | None = None,
        sampling: SamplingParams | None = None,
        with_logprobs: bool = False,
    ) -> Rollout:
        """One episode of the recipe on `engine`. `prompt`/`label` are what OpenRLHF passes (an `AgentTask`
        string, a user message or a message list, and the reference answer). `max_length` caps the context
        (default: the recipe's and the engine's limits). `sampling` defaults to the recipe's, with the recipe's
        per-turn `max_new_tokens`."""
        task = decode_task(prompt, label)
        base = sampling or msgspec.structs.replace(self.recipe.sampling, max_new_tokens=self.recipe.max_new_tokens)
        if self.recipe.agent is not None:  # imported here: the proxy needs the serving app and the openai client
            from agent_train.program_rollout import program_samples

            episode, samples = await program_samples(
                self.recipe, task, engine, prompt=prompt, label=label, sampling=base, max_length=max_length,
                with_logprobs=with_logprobs, engine_timeout_s=self.engine_timeout_s,
            )  # fmt: skip
            return Rollout(trajectory=episode.trajectory, sample=samples[-1], segments=samples)
        runtime = AgentRuntime(
            engine,
            self._definition,
            sampling=base,
            max_context_tokens=max_length,
            engine_timeout_s=self.engine_timeout_s,
        )
        result = await runtime.run(task.prompt, task=task.row, keep_events=True)
        turns = [event for event in result.events if isinstance(event, AssistantEvent)]
        truncated = bool(turns) and turns[-1].finish_reason == "length"
        segments = segment_samples(
            result.trajectory,
            prompt=prompt,
            label=label,
            rewards=self.recipe.rewards,
            with_logprobs=with_logprobs,
            truncated=truncated,
        )
        return Rollout(trajectory=result.trajectory, sample=segments[-1], segments=segments)


def as_tokenizer(source: Any) -> Tokenizer:
    """OpenRLHF's `hf_tokenizer` (a transformers tokenizer) as a `Tokenizer`. A fast tokenizer's own Rust
    backend is used directly, so ids and decoding are exactly those of the model's `tokenizer.json`, the same
    `HFTokenizer` serving loads; a `Tokenizer` is returned as is."""
    if isinstance(source, Tokenizer):
        return source
    backend = getattr(source, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode") and hasattr(backend, "token_to_id"):
        return HFTokenizer(backend, source=str(getattr(source, "name_or_path", "<transformers>")))
    return load_tokenizer(source)
