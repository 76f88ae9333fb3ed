"""`ScriptedEngine`: replays recorded completions as token ids. An honest fake for tests, benchmarks and the
training/serving equivalence check: it runs no model, but every id it returns is a real id of the real
tokenizer, and it applies the same stop and length rules a real engine does.

A script is a list of steps, consumed in order; each is a completion text (tokenized once, here), a list of
ids (used as is), or an exception instance (raised, to test a dead engine). A `policy` callable can be given
instead, to answer each prompt by looking at it (for many concurrent episodes); an `image_policy` also looks at
the call's images (their references, in pad order), as a vision-language model is given pixels with its ids.

Policy versions: `policy_version` (None by default: untracked; `set_policy_version` moves it) tags every id of a
completion, as an engine that tracks versions would. `versions` replays them instead, one entry per call in order:
a list of one version per id of the step (cut with the ids when a stop token or the budget cuts the completion;
a list of another length passes as it is, for tests of bad engine output), or None for the current version.

`calls` records every prompt received, for assertions: a `PromptView` as it came (O(1): views never change), any
other sequence copied. `record=False` keeps nothing (benchmarks, long runs whose memory should not grow).

Its own cost is counted, not hidden: `stats()` (a server's `/metrics` "engine") gives the generations answered and
the CPU seconds spent inside `generate` (the policy, tokenizing its answer, decoding the ids; `delay_s` sleeps
excluded). A real engine does that work on a GPU or in another process, so a benchmark of the server around it
subtracts this figure to get the server's own CPU.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agent_protocol import Tokenizer
from agent_runtime.engines.base import Generation, LLMEngine, PromptView, SamplingParams, checked_policy_version
from agent_runtime.errors import EngineError

__all__ = ["ImagePolicy", "ScriptStep", "ScriptedEngine"]

ScriptStep = str | Sequence[int] | BaseException
Policy = Callable[[Sequence[int]], ScriptStep]
ImagePolicy = Callable[[Sequence[int], Sequence[str]], ScriptStep]


class ScriptedEngine(LLMEngine):
    name = "scripted"
    accepts_images = True  # it sees no pixels; it records which images each call was given (`images_seen`)

    def __init__(
        self,
        tokenizer: Tokenizer,
        script: Iterable[ScriptStep] = (),
        *,
        policy: Policy | None = None,
        image_policy: ImagePolicy | None = None,
        context_length: int = 32768,
        stop_token_ids: Sequence[int] | None = None,
        logprob: float | None = None,
        delay_s: float = 0.0,
        record: bool = True,
        policy_version: int | None = None,
        versions: Iterable[Sequence[int] | None] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        if stop_token_ids is None:
            stop_token_ids = [i for t in ("<|im_end|>", "<|endoftext|>") if (i := tokenizer.token_to_id(t)) is not None]
        self.stop_token_ids = tuple(stop_token_ids)
        if policy is not None and image_policy is not None:
            raise ValueError("give a policy or an image_policy, not both")
        self._script = [self._prepare(step) for step in script]
        self._policy: ImagePolicy | None = image_policy
        if policy is not None:
            self._policy = lambda prompt_ids, images: policy(prompt_ids)
        self._logprob = logprob
        self._delay_s = delay_s
        self._record = record
        if policy_version is not None:
            self.policy_version = checked_policy_version(self.name, policy_version, None)
        self._versions = [None if v is None else list(v) for v in versions]
        self.calls: list[Sequence[int]] = []  # every prompt received, for assertions (when recording)
        self.images_seen: list[tuple[str, ...]] = []  # the images of each call (when recording)
        self._generations = 0
        self._cpu_s = 0.0  # thread CPU inside generate: the stand-in model's own work

    @property
    def remaining(self) -> int:
        return len(self._script)

    def set_policy_version(self, version: int) -> None:
        """Tag the completions from now on with `version` (never below the current one)."""
        self.policy_version = checked_policy_version(self.name, version, self.policy_version)

    def _prepare(self, step: ScriptStep) -> list[int] | BaseException:
        if isinstance(step, BaseException):
            return step
        if isinstance(step, str):
            return self.tokenizer.encode(step)
        return [int(i) for i in step]

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, *, images: Sequence[str] = ()
    ) -> Generation:
        budget = self.max_new_tokens_for(len(prompt_ids), sampling.max_new_tokens)
        if self._record:
            self.calls.append(prompt_ids if isinstance(prompt_ids, PromptView) else list(prompt_ids))
            self.images_seen.append(tuple(images))
        if self._delay_s:
            await asyncio.sleep(self._delay_s)
        started = time.thread_time()
        try:
            return self._answer(prompt_ids, sampling, images, budget)
        finally:
            self._generations += 1
            self._cpu_s += time.thread_time() - started

    def stats(self) -> dict[str, Any]:
        """The stand-in model's own work: generations answered and the CPU seconds they took (see the docstring)."""
        return {"generations": self._generations, "model_cpu_s": self._cpu_s}

    def _answer(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, images: Sequence[str], budget: int
    ) -> Generation:
        if self._policy is not None:
            step = self._prepare(self._policy(prompt_ids, images))
        elif self._script:
            step = self._script.pop(0)
        else:
            raise EngineError("scripted: the script is exhausted; no completion left to replay")
        if isinstance(step, BaseException):
            raise step
        stops = set(self.stop_token_ids) | set(sampling.stop_token_ids)
        ids: list[int] = []
        finish: str = "length"
        for token in step[:budget]:
            ids.append(token)
            if token in stops:
                finish = "stop"
                break
        else:
            if len(step) <= budget and not (ids and ids[-1] in stops):
                finish = "stop"  # the recorded completion simply ended (a stop string, say)
        logprobs = [self._logprob] * len(ids) if self._logprob is not None and sampling.logprobs else None
        return Generation(
            ids=ids,
            text=self.tokenizer.decode(ids),
            logprobs=logprobs,
            finish_reason="stop" if finish == "stop" else "length",
            exact_text=True,
            versions=self._tags(len(step), len(ids)),
        )

    def _tags(self, scripted: int, kept: int) -> list[int] | None:
        """The versions of a completion of `scripted` ids cut to `kept`: the next replayed ones, else the current."""
        replayed = self._versions.pop(0) if self._versions else None
        if replayed is not None:
            return replayed[:kept] if len(replayed) == scripted else replayed
        return None if self.policy_version is None else [self.policy_version] * kept
