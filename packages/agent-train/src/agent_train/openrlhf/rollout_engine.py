"""`OpenRLHFEngine`: OpenRLHF's rollout engine behind the `LLMEngine` interface, so the session drives it.

Inside OpenRLHF the executor gets `llm_engine`, the vLLM rollout actor, whose contract is
``await llm_engine.generate(prompt_token_ids, sampling_params, multi_modal_data=None)`` returning a vLLM
`RequestOutput` (`outputs[0].token_ids`, `.text`, `.logprobs` as one ``{token_id: Logprob}`` dict per token,
`.finish_reason`). This adapter turns one session turn into one such call and the answer into a `Generation`:

- the sampling settings are OpenRLHF's own vLLM `SamplingParams` (temperature, top-p, ... from the launch
  flags); per turn only `max_tokens` (the session's budget for the turn, capped by OpenRLHF's `max_tokens`
  when that is set) and `stop_token_ids` (the protocol's stop tokens added) change, on a copy;
- logprobs are read only when OpenRLHF asked vLLM for them (`sampling_params.logprobs` set), one per
  generated token, the sampled token's own;
- the token ids are kept exactly as vLLM returned them; the text is never re-tokenized;
- what comes back passes `validate_generation` (plain int ids inside the tokenizer's vocabulary, at most the
  turn's `max_tokens`, finite logprobs, a known finish reason), so a rollout actor that answers garbage ends
  its episode as ``engine_bad_output`` instead of putting ids the model cannot have sampled into training;
- policy versions: on OpenRLHF's vLLM actor (one with a vLLM ``llm``), `EngineVersions` counts the weight syncs
  the actor has loaded (`policy_version`) and tags every generated id with the version that sampled it, a turn
  that a sync paused mid-way with two (`Generation.versions`; how no id is misattributed: `engine_versions`).

Images (`accepts_images`, set for a vision-language model: OpenRLHF hands the executor the model's processor):
a turn whose context holds images is one call with ``multi_modal_data={"image": [PIL images]}``, the context's
images in the order of their pads, and `prompt_ids` with every image's pads expanded, exactly as OpenRLHF's
`MultiTurnAgentExecutor` calls it (OpenRLHF's vLLM actor collapses each run itself, `dedup_media_tokens`, before
vLLM expands it again); a context without images passes ``multi_modal_data=None``. Each image is opened once per
episode (PIL, lazily, from the bytes `read_image` gives, as OpenRLHF's `load_images` opens bytes). A generation
that holds an image pad (`image_pad_ids`) is refused as ``engine_bad_output``: a pad with no image behind it
cannot be trained (the model's forward pass matches pads to image features one for one).

vLLM and OpenRLHF are untyped third-party code: everything they hand over is `Any` here and checked where read.
This module does not import either (Pillow only when a turn has images).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from agent_env import decode_image
from agent_protocol import Tokenizer, read_image
from agent_runtime import EngineBadOutput, EngineError, Generation, LLMEngine, SamplingParams
from agent_runtime.engines import plain_ids, tokenizer_vocab_size, validate_generation
from agent_train.openrlhf.engine_versions import EngineVersions, output_versions

__all__ = ["OpenRLHFEngine", "generation_from_output", "turn_sampling_params"]

_NAME: Final = "openrlhf"


class OpenRLHFEngine(LLMEngine):
    """Adapts OpenRLHF's rollout engine (or anything with its `generate` signature) to `LLMEngine`."""

    name = "openrlhf"

    def __init__(
        self,
        rollout_engine: Any,
        tokenizer: Tokenizer,
        sampling_params: Any,
        *,
        context_length: int,
        stop_token_ids: Sequence[int] = (),
        accepts_images: bool = False,
        image_pad_ids: Sequence[int] = (),
    ) -> None:
        """`accepts_images`: the rollout engine serves a vision-language model (OpenRLHF passed its processor);
        `image_pad_ids`: the model's image (and video) pad tokens, which a generation must not hold."""
        if context_length < 1:
            raise ValueError(f"context_length must be at least 1, got {context_length}")
        self.rollout_engine = rollout_engine
        self.tokenizer = tokenizer
        self.sampling_params = sampling_params
        self.context_length = context_length
        self.stop_token_ids = tuple(int(i) for i in stop_token_ids)
        self.with_logprobs = getattr(sampling_params, "logprobs", None) is not None
        self.vocab_size = tokenizer_vocab_size(tokenizer)
        self.accepts_images = accepts_images
        self.image_pad_ids = frozenset(int(i) for i in image_pad_ids)
        self._pictures: dict[str, Any] = {}  # PIL images by reference, opened once per episode
        self.versions = EngineVersions.of(rollout_engine)  # None: an actor without vLLM tracks no versions

    @property
    def policy_version(self) -> int | None:
        """The weight syncs OpenRLHF's actor has loaded (None: untracked)."""
        return None if self.versions is None else self.versions.version

    @policy_version.setter
    def policy_version(self, version: int | None) -> None:
        raise AttributeError("openrlhf: the policy version is the rollout actor's count of loaded weight syncs")

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
    ) -> Generation:
        if images and not self.accepts_images:
            raise ValueError(f"{_NAME}: the rollout engine serves a text-only model; got {len(images)} image(s)")
        budget = self.max_new_tokens_for(len(prompt_ids), sampling.max_new_tokens)
        params = turn_sampling_params(
            self.sampling_params, max_tokens=budget, stop_token_ids=[*self.stop_token_ids, *sampling.stop_token_ids]
        )
        multi_modal_data = {"image": [self._picture(url) for url in images]} if images else None
        try:
            output = await self.rollout_engine.generate(
                plain_ids(prompt_ids), params, multi_modal_data=multi_modal_data
            )
        except Exception as e:
            raise EngineError(f"openrlhf: the rollout engine failed: {type(e).__name__}: {e}") from e
        generation = generation_from_output(
            output, with_logprobs=self.with_logprobs, tokenizer=self.tokenizer, max_tokens=params.max_tokens,
            vocab_size=self.vocab_size, with_versions=self.versions is not None,
        )  # fmt: skip
        pads = self.image_pad_ids.intersection(generation.ids)
        if pads:
            raise EngineBadOutput(
                f"{_NAME}: the model generated image pad token(s) {sorted(pads)}, which no image stands behind"
            )
        return generation

    def _picture(self, url: str) -> Any:
        """The PIL image `url` refers to, decoded once by the project's one decoder (`agent_env.image_decoder`:
        the bytes `read_image` gives, opened as `load_images` opens them, with the frame-header and bomb checks)."""
        picture = self._pictures.get(url)
        if picture is None:
            picture = self._pictures[url] = decode_image(read_image(url))
        return picture


def turn_sampling_params(base: Any, *, max_tokens: int, stop_token_ids: Sequence[int] = ()) -> Any:
    """A copy of OpenRLHF's sampling params for one turn: `max_tokens` at most `max_tokens` (and at most the
    base's own `max_tokens` when set), `stop_token_ids` extended. vLLM's params are a msgspec Struct, replaced
    so that vLLM recomputes its derived stop set; any other object is deep-copied and assigned to."""
    cap = getattr(base, "max_tokens", None)
    tokens = max_tokens if cap is None else min(max_tokens, int(cap))
    stops = list(dict.fromkeys([*(getattr(base, "stop_token_ids", None) or []), *stop_token_ids]))
    if isinstance(base, msgspec.Struct):
        return msgspec.structs.replace(base, max_tokens=tokens, stop_token_ids=stops)
    params = copy.deepcopy(base)
    params.max_tokens = tokens
    params.stop_token_ids = stops
    return params


def generation_from_output(
    output: Any,
    *,
    with_logprobs: bool,
    tokenizer: Tokenizer,
    max_tokens: int,
    vocab_size: int | None,
    with_versions: bool = False,
) -> Generation:
    """A vLLM `RequestOutput` (its first completion) as a checked `Generation`, with the policy versions the
    `EngineVersions` tap put on it when `with_versions` (an untapped output then is an `EngineBadOutput`: the
    tracker missed it, and a record must not guess). Raises `EngineBadOutput` when it is not shaped like one or
    fails `validate_generation`; `EngineError` for vLLM's own ``"error"``."""
    try:
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        reason = completion.finish_reason
        entries = completion.logprobs
    except (AttributeError, IndexError, TypeError, ValueError) as e:
        raise EngineBadOutput(
            f"{_NAME}: the rollout engine answered {type(output).__name__}, not a RequestOutput"
        ) from e
    logprobs: list[float] | None = None
    if with_logprobs and entries is not None:
        if len(entries) != len(ids):
            raise EngineBadOutput(f"{_NAME}: {len(entries)} logprob entries for {len(ids)} generated tokens")
        logprobs = [_sampled_logprob(entry, token) for entry, token in zip(entries, ids, strict=True)]
    versions = output_versions(output) if with_versions else None
    if with_versions and versions is None:
        raise EngineBadOutput(f"{_NAME}: the rollout actor's output carries no policy versions (it was not tapped)")
    return validate_generation(
        _NAME, tokenizer, ids=ids, logprobs=logprobs, finish_reason=reason, max_tokens=max_tokens,
        vocab_size=vocab_size, versions=versions,
    )  # fmt: skip


def _sampled_logprob(entry: Any, token: int) -> float:
    """The sampled token's logprob from one position's ``{token_id: Logprob}``; vLLM always includes the sampled
    token, 0.0 stands in if it did not (as OpenRLHF's own executor does)."""
    found = entry.get(token) if entry is not None else None
    return 0.0 if found is None else float(found.logprob)
