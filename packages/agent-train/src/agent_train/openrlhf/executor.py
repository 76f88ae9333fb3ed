"""`AgentExecutor`: a recipe's agent as an OpenRLHF agent executor (`--train.agent_func_path`).

    executor = AgentExecutor("recipes/calculator.py")
    sample = await executor.execute(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine)

OpenRLHF calls `execute` once per rollout, inside its vLLM rollout actor, and trains on the dict it returns.
The episode is not re-implemented here: `execute` wraps OpenRLHF's rollout engine in `OpenRLHFEngine` and runs
the recipe's session with `AgentRuntime`, the same loop `apps/serve` runs, so prompt rendering, token-in-token-out
transcripts, parsing, tools, rewards, budgets and compaction are the serving code's, byte for byte. The finished
`Trajectory` becomes one record per segment (`segment_samples`, see `sample.py`), and OpenRLHF gets them as one
dict (`segments.episode_record`): the last segment's, the earlier ones under ``agent_segments`` for the
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
A command program (`AgentProgram.command`, a process per episode) reaches its endpoint through the worker's one
listening gateway (`agent_runtime.proxy.WorkerGateway`): started on the executor's loop (in OpenRLHF, the vLLM
actor's) by the first such episode, shared by all the others, stopped by `aclose` or at the actor's exit; its
address comes from ``AGENT_GATEWAY_HOST``/``AGENT_GATEWAY_PORT``/``AGENT_GATEWAY_ADVERTISED_HOST`` (loopback and
an ephemeral port by default).

Vision-language recipes (`ChatProtocol.accepts_images`) follow OpenRLHF 0.11.2's VLM contract: OpenRLHF passes the
model's processor as `hf_tokenizer` (`as_tokenizer` keeps its image grid) and the row's image column as `images`,
which `task.place_images` puts into the prompt where OpenRLHF's prompt dataset renders them. The conversation
expands each image's pad as the processor does, each turn reaches the vLLM actor with ``multi_modal_data`` (see
`OpenRLHFEngine`), and every segment's record carries `mm_train_inputs`: the processor's tensors for that
segment's images in pad order, built as `MultiTurnAgentExecutor` builds them (`process_prompt_with_images` on the
prompt and on each feedback with images, merged by `accumulate_mm_inputs`), and `images`, the row's images echoed
as OpenRLHF echoes them. A text-only recipe given images is an error that says so.

Overflow: OpenRLHF's executor keeps feedback that overflows `max_length` without its images (pads stripped) and
goes on; here feedback that does not fit ends the episode (``context_exhausted``), so an image that does not fit
never enters the transcript. Either way no record holds a pad without its image or an image without its pads;
`mm_train_inputs` checks it for every record (and the engine refuses a generated pad).

With `trajectory_log` (``AGENT_TRAJECTORY_LOG`` for OpenRLHF's no-argument executor, `agent_func.py`), `execute`
also appends each episode's `Trajectory` to that JSONL file (`TrajectoryWriter`: one line per episode, whole lines
from any number of tasks and rollout processes on one machine), the records OpenRLHF's dict was made from: the
trajectory viewer opens it (``uv run apps/serve --trajectories FILE``). OpenRLHF does not tell the executor its
step, so the records carry none; they are in rollout order. A failed write is logged, never raised: the episode
still trains.

`rollout()` is the same episode for callers outside OpenRLHF (the local trainer): it takes any `LLMEngine` and
returns the whole `Trajectory` with its segment records. OpenRLHF constructs its executor with no arguments;
`agent_train/openrlhf/agent_func.py` is that no-argument class, reading the recipe from ``AGENT_RECIPE``.
This module imports OpenRLHF (for the base class), hence torch; the package root does not import it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog
from openrlhf.utils.agent import AgentExecutorBase

from agent_protocol import (
    HFTokenizer,
    Tokenizer,
    TranscriptRecord,
    TransformersTokenizer,
    collapse_image_pads,
    load_tokenizer,
    processor_vision_grid,
    read_image,
)
from agent_runtime import (
    AgentRuntime,
    AssistantEvent,
    LLMEngine,
    ProgramCommand,
    Recipe,
    SamplingParams,
    Trajectory,
    TrajectoryWriter,
    load_recipe,
)
from agent_train.openrlhf.rollout_engine import OpenRLHFEngine
from agent_train.openrlhf.segments import episode_record
from agent_train.sample import RolloutSample, segment_samples
from agent_train.task import dataset_images, decode_task

__all__ = ["AgentExecutor", "Rollout", "as_tokenizer", "image_pad_ids", "mm_train_inputs"]

logger = structlog.get_logger(__name__)


class Rollout(msgspec.Struct, frozen=True, kw_only=True):
    """One episode: the full `trajectory`, one record per segment (`segments`, in order) and the last of them
    (`sample`, what OpenRLHF trains without the segment extension)."""

    trajectory: Trajectory
    sample: RolloutSample
    segments: list[RolloutSample] = msgspec.field(default_factory=list)


class AgentExecutor(AgentExecutorBase):  # type: ignore[misc]  # OpenRLHF is untyped
    """Runs a recipe's episodes for OpenRLHF. `engine_timeout_s` bounds one generation (None: no bound, as in
    OpenRLHF's own executors; a generation that times out ends only its episode, as ``engine_timeout``).
    `trajectory_log`: a JSONL file `execute` appends each episode's `Trajectory` to (see the module docstring)."""

    def __init__(
        self,
        recipe: Recipe | str | Path,
        *,
        engine_timeout_s: float | None = None,
        trajectory_log: str | Path | None = None,
    ) -> None:
        self.recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
        self.engine_timeout_s = engine_timeout_s
        self.trajectory_writer = TrajectoryWriter(trajectory_log) if trajectory_log else None
        self._definition = self.recipe.make_session()  # spawned per episode; the engine's tokenizer is bound then
        self._tokenizers: dict[tuple[Any, ...], Tokenizer] = {}
        self.worker_gateway: Any = None  # its `WorkerGateway`, made by the first episode of a command program
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
        """OpenRLHF's entry point: one episode on `prompt` (with the row's `images`), returned as the dict OpenRLHF
        consumes."""
        protocol = self._definition.protocol
        refs = dataset_images(images)
        if refs and not protocol.accepts_images:
            raise ValueError(
                f"recipe {self.recipe.name!r} is text-only (protocol {protocol.name!r}); this dataset row carries "
                f"{len(refs)} image(s): use a vision-language protocol such as qwen3-vl"
            )
        tokenizer = self.tokenizer_for(hf_tokenizer)
        stops = (tokenizer.token_to_id(text) for text in protocol.stop_texts)
        vision = protocol.accepts_images and hasattr(hf_tokenizer, "image_processor")
        pads = image_pad_ids(hf_tokenizer, tokenizer, protocol.image_pad) if vision else frozenset()
        engine = OpenRLHFEngine(
            llm_engine,
            tokenizer,
            sampling_params,
            context_length=int(max_length),
            stop_token_ids=tuple(i for i in stops if i is not None),
            accepts_images=vision,
            image_pad_ids=sorted(pads),
        )
        rollout = await self.rollout(
            prompt, label, engine, max_length=int(max_length), with_logprobs=engine.with_logprobs, images=refs
        )
        if self.trajectory_writer is not None:
            await asyncio.to_thread(_log, self.trajectory_writer, rollout.trajectory)
        segments = rollout.segments
        if vision:
            inputs = await asyncio.to_thread(
                lambda: [mm_train_inputs(r, hf_tokenizer, tokenizer, pads) for r in rollout.trajectory.segments]
            )
            segments = [
                msgspec.structs.replace(sample, images=images, mm_train_inputs=mm)
                for sample, mm in zip(segments, inputs, strict=True)
            ]
        elif images is not None:
            segments = [msgspec.structs.replace(sample, images=images) for sample in segments]
        return episode_record(segments)

    def tokenizer_for(self, hf_tokenizer: Any) -> Tokenizer:
        """`as_tokenizer(hf_tokenizer)`, built once per tokenizer (`_tokenizer_key`) and reused by every episode:
        a fresh one per episode cost about 0.6 ms and started its piece caches empty each time."""
        key = _tokenizer_key(hf_tokenizer)
        if key is None:
            return as_tokenizer(hf_tokenizer)
        cached = self._tokenizers.get(key)
        if cached is None:
            cached = self._tokenizers[key] = as_tokenizer(hf_tokenizer)
        return cached

    async def rollout(
        self,
        prompt: Any,
        label: Any,
        engine: LLMEngine,
        *,
        max_length: int | None = None,
        sampling: SamplingParams | None = None,
        with_logprobs: bool = False,
        images: Sequence[str] = (),
    ) -> Rollout:
        """One episode of the recipe on `engine`. `prompt`/`label` are what OpenRLHF passes (an `AgentTask`
        string, a user message or a message list, and the reference answer); `images` the row's image references
        (`task.dataset_images`), placed in the prompt by `task.place_images`. `max_length` caps the context
        (default: the recipe's and the engine's limits). `sampling` defaults to the recipe's, with the recipe's
        per-turn `max_new_tokens`."""
        task = decode_task(prompt, label, images=images, vision=self._definition.protocol.accepts_images)
        base = sampling or msgspec.structs.replace(self.recipe.sampling, max_new_tokens=self.recipe.max_new_tokens)
        if self.recipe.agent is not None:  # imported here: the proxy needs the serving app and the openai client
            if images:
                raise ValueError(f"recipe {self.recipe.name!r} runs an agent program, which takes no dataset images")
            from agent_train.program_rollout import program_samples

            episode, samples = await program_samples(
                self.recipe, task, engine, prompt=prompt, label=label, sampling=base, max_length=max_length,
                with_logprobs=with_logprobs, engine_timeout_s=self.engine_timeout_s, gateway=await self.gateway(),
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

    async def gateway(self) -> Any:
        """The worker's `Gateway` for a command program's episodes (started on the running loop when first asked
        for, then shared); None for a recipe whose program is a function or that runs no program."""
        program = self.recipe.agent
        if program is None or not isinstance(program.agent, ProgramCommand):
            return None
        if self.worker_gateway is None:
            from agent_runtime.proxy import WorkerGateway

            self.worker_gateway = WorkerGateway()
        return await self.worker_gateway.get()

    async def aclose(self) -> None:
        """Stop the worker's gateway, if one was started (on its loop). OpenRLHF never calls it: there the gateway
        stops at the actor's exit."""
        if self.worker_gateway is not None:
            await self.worker_gateway.aclose()


def _log(writer: TrajectoryWriter, trajectory: Trajectory) -> None:
    try:
        writer.write(trajectory)
    except OSError as e:  # a full disk loses a log line, never the episode
        logger.error("trajectory_write_failed", path=str(writer.path), error=str(e))


def _tokenizer_key(source: Any) -> tuple[Any, ...] | None:
    """What identifies OpenRLHF's `hf_tokenizer` across calls (Ray hands each call its own unpickled copy): a text
    tokenizer's class, name, model vocabulary size and number of added tokens (`get_vocab_size(True)` would build
    the whole vocabulary: about 40 ms a call, on the rollout's event loop). None for a processor (its image grid
    too) or an unknown object: those are adapted per episode."""
    if hasattr(source, "image_processor") or isinstance(source, Tokenizer):
        return None
    backend = getattr(source, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "get_vocab_size"):
        return None
    added = len(backend.get_added_tokens_decoder())
    return type(source).__name__, str(getattr(source, "name_or_path", "")), backend.get_vocab_size(False), added


def as_tokenizer(source: Any) -> Tokenizer:
    """OpenRLHF's `hf_tokenizer` as a `Tokenizer`: a transformers tokenizer, or for a vision-language model its
    processor (the text tokenizer is ``processor.tokenizer``; the processor's image grid, `processor_vision_grid`,
    becomes the tokenizer's `vision`). A fast tokenizer's own Rust backend is used directly, so ids and decoding
    are exactly those of the model's `tokenizer.json`, the same `HFTokenizer` serving loads; a `Tokenizer` is
    returned as is."""
    if isinstance(source, Tokenizer):
        return source
    vision = processor_vision_grid(source)
    text = getattr(source, "tokenizer", None) if hasattr(source, "image_processor") else None
    text = source if text is None else text
    backend = getattr(text, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode") and hasattr(backend, "token_to_id"):
        return HFTokenizer(backend, source=str(getattr(text, "name_or_path", "<transformers>")), vision=vision)
    adapted = load_tokenizer(text)
    if vision is not None and isinstance(adapted, TransformersTokenizer):
        adapted.vision = vision
    return adapted


def image_pad_ids(processor: Any, tokenizer: Tokenizer, image_pad: str | None) -> frozenset[int]:
    """The model's image and video pad ids: the processor's ``image_token_id`` / ``video_token_id`` (what
    OpenRLHF's vLLM actor collapses) and the protocol's `image_pad` token."""
    ids = {getattr(processor, name, None) for name in ("image_token_id", "video_token_id")}
    ids.add(None if image_pad is None else tokenizer.token_to_id(image_pad))
    return frozenset(int(i) for i in ids if i is not None)


def mm_train_inputs(
    record: TranscriptRecord, processor: Any, tokenizer: Tokenizer, pad_ids: frozenset[int]
) -> dict[str, Any] | None:
    """The processor's tensors (``pixel_values``, ``image_grid_thw``, ...) for one segment's images in pad order,
    as OpenRLHF's `MultiTurnAgentExecutor` builds them: `process_prompt_with_images` on the text of the prompt and
    of each feedback that holds images (the span's ids with each run of pads collapsed, decoded), merged with
    `accumulate_mm_inputs`. None for a segment without images.

    Raises ValueError when the segment is not trainable as a VLM sample: a pad outside every image (or an image
    span that is not all pads), or a span whose ids the processor expands differently (the image grid the
    conversation expanded pads with is not the processor's)."""
    from openrlhf.utils.vlm_utils import accumulate_mm_inputs, process_prompt_with_images

    covered = sum(image.end - image.start for image in record.images)
    pads = sum(1 for token in record.ids if token in pad_ids)
    spans_ok = all(all(t in pad_ids for t in record.ids[i.start : i.end]) for i in record.images)
    if pads != covered or not spans_ok:
        raise ValueError(
            f"a segment holds {pads} image pad tokens and {len(record.images)} images covering {covered}: a pad "
            "without an image (or an image without its pads) cannot be trained"
        )
    merged: dict[str, Any] | None = None
    for span in record.spans:
        sources = [image.source for image in record.images if span.start <= image.start < span.end]
        if not sources:
            continue
        ids = record.ids[span.start : span.end]
        text = tokenizer.decode(collapse_image_pads(ids, pad_ids))
        theirs, inputs, _ = process_prompt_with_images(processor, text, [read_image(url) for url in sources])
        if theirs != ids:
            raise ValueError(
                f"the processor tokenizes the {span.kind} at {span.start} with its {len(sources)} image(s) into "
                f"{len(theirs)} ids, the conversation into {len(ids)}: its image grid is not the processor's"
            )
        merged = accumulate_mm_inputs(merged, inputs)
    return merged
