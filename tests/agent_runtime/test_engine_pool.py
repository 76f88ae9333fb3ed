"""`OpenAIEngine` over several upstreams: two real completions servers on loopback (uvicorn + Starlette in
threads, `CompletionsServer`), many concurrent episodes. Affinity is measured from the upstreams' own request
logs (which server saw which episode's prompts), not from the engine's bookkeeping; a server is stopped mid-run
and its episodes must finish on the other with the ids a single server gives."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from agent_protocol import HFTokenizer
from agent_runtime.engine_call import EngineFailure, call_engine
from agent_runtime.engines.base import SamplingParams
from agent_runtime.engines.openai_http import OpenAIEngine
from agent_runtime.engines.scripted import ScriptedEngine
from agent_runtime.engines.upstream_pool import UpstreamPool
from agent_runtime.errors import EngineUnavailable
from tests.support.completions_server import CompletionsServer

SAMPLING = SamplingParams(max_new_tokens=32, temperature=0.0)
FEEDBACK = [151645, 198, 151644, 872, 198]  # <|im_end|>\n<|im_start|>user\n: the next turn's observation


def answer(prompt: Sequence[int]) -> str:
    """Each server's model: an answer that depends on the whole prompt, so a wrong transcript shows."""
    return f"seen {len(prompt)} tokens, last {prompt[-1]}<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(qwen3_tokenizer_file)


@pytest.fixture
def servers(tokenizer: HFTokenizer) -> Iterator[list[CompletionsServer]]:
    running = [
        CompletionsServer(ScriptedEngine(tokenizer, policy=answer, logprob=-0.25, record=False)).start()
        for _ in range(2)
    ]
    for server in running:
        server.faults.delay_s = 0.01  # requests overlap, so in-flight counts mean something
    yield running
    for server in running:
        if server._thread.is_alive():
            server.stop()


def pool_engine(tokenizer: HFTokenizer, urls: str | Sequence[str], **options: object) -> OpenAIEngine:
    options = {"max_retries": 2, "backoff_s": 0.02, "backoff_max_s": 0.1, "deadline_s": 30.0} | options
    return OpenAIEngine(urls, model="tiny-qwen3", tokenizer=tokenizer, context_length=4096, **options)  # type: ignore[arg-type]


def start_of(n: int, tokenizer: HFTokenizer) -> list[int]:
    return [151644, 872, 198, *tokenizer.encode(f"episode {n:03d}: go"), 151645, 198, 151644, 77091, 198]


async def run_episode(
    engine: OpenAIEngine,
    reference: ScriptedEngine,
    start: list[int],
    key: str,
    turns: int,
    done: list[int],
    pause: tuple[int, asyncio.Event] | None = None,
) -> None:
    """`turns` engine calls of one episode, each checked against the ids one honest server gives; `pause`: after
    that many turns, wait for the event."""
    prompt = list(start)
    for turn in range(turns):
        if pause is not None and turn == pause[0]:
            await pause[1].wait()
        outcome = await call_engine(engine, prompt, SAMPLING, timeout_s=30, session=key)
        assert not isinstance(outcome, EngineFailure), outcome
        expected = await reference.generate(prompt, SAMPLING)
        assert (outcome.ids, outcome.logprobs) == (expected.ids, expected.logprobs)
        prompt = [*prompt, *outcome.ids, *FEEDBACK[1:]]
        done.append(1)


def episodes_seen(server: CompletionsServer, starts: dict[tuple[int, ...], int]) -> list[int]:
    """The episode of each request this server received, told by its prompt's opening (the server's own log)."""
    width = len(next(iter(starts)))
    return [starts[tuple(body["prompt"][:width])] for body in server.requests]


def test_each_episode_stays_on_one_upstream_and_load_spreads(
    servers: list[CompletionsServer], tokenizer: HFTokenizer
) -> None:
    engine = pool_engine(tokenizer, [s.base_url for s in servers])
    reference = ScriptedEngine(tokenizer, policy=answer, logprob=-0.25, record=False)
    episodes, turns = 24, 4
    starts = {tuple(start_of(n, tokenizer)): n for n in range(episodes)}
    done: list[int] = []

    async def main() -> None:
        await asyncio.gather(
            *(run_episode(engine, reference, list(s), f"ep-{n}", turns, done) for s, n in starts.items())
        )
        await engine.close()

    asyncio.run(main())
    assert len(done) == episodes * turns
    seen = [episodes_seen(server, starts) for server in servers]
    assert sum(map(len, seen)) == episodes * turns  # every call was one request: nothing retried, nothing lost
    # affinity, from the servers' logs: the turns of each episode on its most used server / all its turns
    on_main = sum(max(log.count(n) for log in seen) for n in range(episodes))
    assert on_main / (episodes * turns) >= 0.95
    for log in seen:  # both servers work
        assert 0.25 <= len(log) / (episodes * turns) <= 0.75, [len(x) for x in seen]
    # the session key travels as a header on every request, the episode's own
    for server, log in zip(servers, seen, strict=True):
        assert [h.get("x-session-id") for h in server.request_headers] == [f"ep-{n}" for n in log]
    stats = engine.stats()
    assert [u["requests"] for u in stats["upstreams"]] == [len(log) for log in seen]
    assert all(u["in_flight"] == 0 and u["failures"] == 0 and u["up"] for u in stats["upstreams"])
    assert stats["affinity"]["turns"] == episodes * (turns - 1)
    assert stats["affinity"]["ratio"] == 1.0 and stats["affinity"]["sessions"] == episodes


def test_a_killed_upstream_fails_over_and_its_episodes_finish(
    servers: list[CompletionsServer], tokenizer: HFTokenizer
) -> None:
    engine = pool_engine(tokenizer, [s.base_url for s in servers], down_s=60.0)
    reference = ScriptedEngine(tokenizer, policy=answer, logprob=-0.25, record=False)
    episodes, turns = 16, 6
    starts = {tuple(start_of(n, tokenizer)): n for n in range(episodes)}
    done: list[int] = []
    killed, survivor = servers

    async def main() -> None:
        resume = asyncio.Event()

        async def kill_midway() -> None:
            while len(done) < episodes * 2:  # every episode has had two turns and waits for its third
                await asyncio.sleep(0.005)
            await asyncio.to_thread(killed.stop)  # new connections refused from now on
            resume.set()

        runs = (
            run_episode(engine, reference, list(s), f"ep-{n}", turns, done, pause=(2, resume))
            for s, n in starts.items()
        )
        await asyncio.gather(kill_midway(), *runs)  # any episode that fails raises here
        await engine.close()

    asyncio.run(main())
    assert len(done) == episodes * turns
    before, after = episodes_seen(killed, starts), episodes_seen(survivor, starts)
    moved = {n for n in before if n in after}
    assert moved, "no episode of the killed server went on"
    assert set(before) | set(after) == set(range(episodes))
    # each moved episode was re-pinned: once on the survivor, it never went back (the killed server's log ends)
    for n in moved:
        assert before.count(n) + after.count(n) >= turns
    stats = engine.stats()
    dead, live = stats["upstreams"]
    assert dead["failures"] >= 1 and not dead["up"] and live["failures"] == 0 and live["up"]
    affinity = stats["affinity"]
    assert affinity["repinned"] == len(moved)  # each moved once, then kept to the survivor
    assert affinity["turns"] == episodes * (turns - 1) and affinity["pinned_turns"] == affinity["turns"] - len(moved)


def test_an_upstream_killed_with_requests_in_flight_loses_none(
    servers: list[CompletionsServer], tokenizer: HFTokenizer
) -> None:
    """The killed server holds its answers past its 1 s graceful shutdown, so uvicorn cuts the connections under
    requests in flight: those are retried, refused, and answered by the other server."""
    engine = pool_engine(tokenizer, [s.base_url for s in servers])
    reference = ScriptedEngine(tokenizer, policy=answer, logprob=-0.25, record=False)
    killed, survivor = servers
    killed.faults.delay_s = 5.0
    episodes = 8
    starts = {tuple(start_of(n, tokenizer)): n for n in range(episodes)}
    done: list[int] = []
    # The pool sends a key to the upstream rendezvous hashing ranks first, and the servers' ports change every run:
    # keys are chosen so that the even episodes rank the server to be killed first, the odd ones the survivor
    # (asked of an idle pool over the same URLs), so half the first turns are in flight there, in any run.
    probe = UpstreamPool(engine.base_urls)
    first_on = [killed.base_url.rstrip("/"), survivor.base_url.rstrip("/")]
    keys = [
        next(key for i in itertools.count() if probe.pick(key := f"ep-{n}-{i}").url == first_on[n % 2])  # type: ignore[union-attr]
        for n in range(episodes)
    ]

    async def main() -> None:
        async def kill_under_load() -> None:
            while len(killed.requests) < episodes // 2:  # its share of the first turns has arrived
                await asyncio.sleep(0.005)
            await asyncio.to_thread(killed.stop)

        runs = (run_episode(engine, reference, list(s), keys[n], 2, done) for s, n in starts.items())
        await asyncio.gather(kill_under_load(), *runs)
        await engine.close()

    asyncio.run(main())
    assert len(done) == episodes * 2
    cut = episodes_seen(killed, starts)
    assert len(cut) == episodes // 2  # none of them was answered there ...
    after = episodes_seen(survivor, starts)
    assert all(after.count(n) == 2 for n in cut)  # ... each was answered by the survivor, its next turn too
    dead, live = engine.stats()["upstreams"]
    assert dead["failures"] == episodes // 2 and not dead["up"] and live["failures"] == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_upstream_dead_is_a_clear_engine_unavailable(tokenizer: HFTokenizer) -> None:
    urls = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]
    engine = pool_engine(tokenizer, urls)

    async def main() -> EngineFailure:
        outcome = await call_engine(engine, start_of(0, tokenizer), SAMPLING, timeout_s=30, session="ep-0")
        with pytest.raises(EngineUnavailable) as raised:
            await engine.generate(start_of(1, tokenizer), SAMPLING)
        await engine.close()
        assert all(url in str(raised.value) for url in urls)
        assert isinstance(outcome, EngineFailure)
        return outcome

    failure = asyncio.run(main())
    assert failure.code == "engine_error"
    assert "every upstream is unavailable (2)" in failure.message
    assert all(f"{url}/completions refused the connection" in failure.message for url in urls)
    assert all(u["failures"] >= 1 and not u["up"] for u in engine.stats()["upstreams"])


def test_header_is_configurable_and_absent_without_a_session(
    servers: list[CompletionsServer], tokenizer: HFTokenizer
) -> None:
    server = servers[0]
    named = pool_engine(tokenizer, [server.base_url], session_header="X-Affinity")
    silent = pool_engine(tokenizer, server.base_url, session_header=None)

    async def main() -> None:
        for engine in (named, silent):
            assert not isinstance(await call_engine(engine, start_of(0, tokenizer), SAMPLING, timeout_s=30,
                                                    session="conv-1"), EngineFailure)  # fmt: skip
        await named.generate(start_of(1, tokenizer), SAMPLING)  # no session: no header
        await named.close()
        await silent.close()

    asyncio.run(main())
    headers = server.request_headers
    assert headers[0].get("x-affinity") == "conv-1" and "x-session-id" not in headers[0]
    assert "x-affinity" not in headers[1] and "x-session-id" not in headers[1]
    assert "x-affinity" not in headers[2]


def test_the_affinity_table_is_bounded() -> None:
    pool = UpstreamPool(["http://a/v1", "http://b/v1"], max_sessions=4)
    first = {key: pool.pick(key) for key in (f"s{i}" for i in range(10))}
    assert pool.stats()["affinity"]["sessions"] == 4 and pool.evicted == 6
    for key in ("s6", "s7", "s8", "s9"):  # the newest stay pinned
        assert pool.pinned(key) is first[key] and pool.pick(key) is first[key]
    assert all(pool.pinned(f"s{i}") is None for i in range(6))  # the oldest were dropped
    with pytest.raises(ValueError, match="repeat"):
        UpstreamPool(["http://a/v1", "http://a/v1"])
    with pytest.raises(ValueError, match="at least one"):
        UpstreamPool([])


def test_pools_in_separate_processes_agree_on_each_key_and_an_overloaded_upstream_is_passed_over() -> None:
    """Replicas of the server each hold their own pool: a key's first turn must land on the same upstream in every
    one (rendezvous hashing), and only the keys of an upstream that goes down move."""
    urls = ["http://a/v1", "http://b/v1", "http://c/v1"]
    keys = [f"conversation-{i}" for i in range(300)]
    one, other = UpstreamPool(urls), UpstreamPool(list(reversed(urls)))
    chosen = {key: one.pick(key).url for key in keys}  # type: ignore[union-attr]
    assert chosen == {key: other.pick(key).url for key in keys}  # type: ignore[union-attr]
    assert all(60 <= list(chosen.values()).count(url) <= 140 for url in urls)  # spread over all three
    # b goes down: its keys move, no other key does
    down = UpstreamPool(urls, down_s=60)
    down.failed(down.upstreams[1], unreachable=True)
    moved = {key: down.pick(key).url for key in keys}  # type: ignore[union-attr]
    assert {k for k in keys if moved[k] != chosen[k]} == {k for k in keys if chosen[k] == urls[1]}
    # an upstream with more than its share in flight (1.5x the mean, counting the new call) is passed over for a
    # new key, which goes to the next in the key's ranking; a key already pinned stays, loaded or not
    fresh = UpstreamPool(urls)
    ranked_first = fresh.pick("new-key")
    assert ranked_first is not None
    diverted = UpstreamPool(urls)
    busy = next(u for u in diverted.upstreams if u.url == ranked_first.url)
    busy.in_flight = 2  # room: max(2, ceil(1.5 * 3 / 3)) = 2, so 2 in flight is full
    assert diverted.pick("new-key") is not busy
    ranked_first.in_flight = 2
    assert fresh.pick("new-key") is ranked_first
