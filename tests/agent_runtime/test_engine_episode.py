"""`EpisodeEngine` (an agent program's view of the rollout engine) keeps the engine's image seam: it takes images
when the engine it wraps does, passes them on in pad order, and still caps and re-samples each request."""

from __future__ import annotations

import asyncio

from agent_runtime.engine_call import EngineFailure, call_engine
from agent_runtime.engines.base import SamplingParams
from agent_runtime.engines.scripted import ScriptedEngine
from agent_runtime.proxy.episode_engine import EpisodeEngine
from tests.support.byte_tokenizer import byte_level_tokenizer

TOKENIZER = byte_level_tokenizer(["<|im_end|>", "<|image_pad|>"], source="episode-engine-test")
IMAGES = ("data:image/png;base64,AAAA", "file:///tmp/two.png")


def test_images_reach_the_wrapped_engine_in_pad_order() -> None:
    inner = ScriptedEngine(TOKENIZER, ["seen"])
    episode = EpisodeEngine(inner, SamplingParams(temperature=0.5), max_tokens=100)
    assert episode.accepts_images  # the wrapped engine takes images, so the episode's view does too
    outcome = asyncio.run(call_engine(episode, [1, 257, 257, 2, 257], SamplingParams(), timeout_s=None, images=IMAGES))
    assert not isinstance(outcome, EngineFailure), outcome
    assert inner.images_seen == [IMAGES]
    assert episode.generated == len(outcome.ids)


def test_a_text_only_engine_stays_text_only_behind_the_episode() -> None:
    inner = ScriptedEngine(TOKENIZER, ["never"])
    inner.accepts_images = False
    episode = EpisodeEngine(inner, SamplingParams())
    outcome = asyncio.run(call_engine(episode, [1, 257], SamplingParams(), timeout_s=None, images=IMAGES[:1]))
    assert isinstance(outcome, EngineFailure)
    assert outcome.code == "engine_error" and "text-only" in outcome.message
    assert inner.calls == []


def test_a_text_prompt_is_passed_on_without_images() -> None:
    inner = ScriptedEngine(TOKENIZER, ["text"])
    episode = EpisodeEngine(inner, SamplingParams(), max_tokens=2)
    generation = asyncio.run(episode.generate([1, 2], SamplingParams(max_new_tokens=50)))
    assert len(generation.ids) == 2  # capped by the episode's budget
    assert inner.images_seen == [()]
