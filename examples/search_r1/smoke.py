"""Smoke mode of the search_r1 example: search, read, answer, on CPU, no model download.

    uv run python -m examples.search_r1.smoke          # from the repository root

The recipe is loaded as the apps load it (BM25 over the shipped corpus) and driven by `AgentRuntime` with a
`ScriptedEngine` whose policy reads like a trained Search-R1 agent: it takes the entity from the question, calls
`local_search`, finds that entity's passage among the results and reads the fact off it; a two-hop question
searches again for the entity the first passage named. It never sees the gold answer: a fact that search does not
return stays unknown, and the exact-match reward says so.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent_runtime import load_recipe
from examples._smoke import Prompt, describe, quiet_logs, reply, runtime_for, scripted_engine, tool_call

RECIPE_PATH: Final = Path(__file__).with_name("recipe.py")
CORPUS_PATH: Final = Path(__file__).with_name("data") / "corpus.jsonl"

# A relation: the words a search adds to the entity's name, and the pattern that reads the fact off its passage.
_BORN_IN: Final = ("born", re.compile(r"[Bb]orn in ([A-Z]\w+)"))
_BORN_YEAR: Final = ("born", re.compile(r"[Bb]orn in [A-Z]\w+ in (\d{4})"))
_FOUNDED_YEAR: Final = ("founded", re.compile(r"founded in (\d{4})"))
_FOUNDER: Final = ("founded by", re.compile(r"founded in \d{4} by ([A-Z]\w+ [A-Z]\w+)"))
_RIVER: Final = ("river", re.compile(r"on the ([A-Z]\w+ River)"))
_SEA: Final = ("flows into sea", re.compile(r"into the ([A-Z]\w+ Sea)"))
Relation = tuple[str, re.Pattern[str]]

# Question shapes and the chain of relations that answers them (most specific first).
_PLANS: Final[list[tuple[re.Pattern[str], list[Relation]]]] = [
    (re.compile(r"^Which river flows through the birthplace of (.+)\?$"), [_BORN_IN, _RIVER]),
    (re.compile(r"^Which river flows through (.+)\?$"), [_RIVER]),
    (re.compile(r"^Into which sea does the river of (.+) flow\?$"), [_RIVER, _SEA]),
    (re.compile(r"^In which town was the founder of the (.+) born\?$"), [_FOUNDER, _BORN_IN]),
    (re.compile(r"^Where was (.+) born\?$"), [_BORN_IN]),
    (re.compile(r"^In what year was the (.+) founded\?$"), [_FOUNDED_YEAR]),
    (re.compile(r"^In what year was (.+) born\?$"), [_BORN_YEAR]),
    (re.compile(r"^Who founded the (.+)\?$"), [_FOUNDER]),
]
_DOC: Final = re.compile(r"Doc \d+ \(Title: (.*?)\) (.*?)(?=\n\nDoc \d+ \(Title: |\Z)", re.S)


def read_fact(results: str, entity: str, pattern: re.Pattern[str]) -> str | None:
    """The fact about `entity` in a search result: from its own passage first, else from any passage naming it."""
    docs = _DOC.findall(results)
    ranked = [text for title, text in docs if title.lower() == entity.lower()]
    ranked += [text for title, text in docs if title.lower() != entity.lower() and entity in text]
    for text in ranked:
        if found := pattern.search(text):
            return found.group(1)
    return None


def policy(prompt: Prompt) -> str:
    """One turn of the search agent, decided from the prompt alone (see the module docstring)."""
    plan = next(((m.group(1), hops) for p, hops in _PLANS if (m := p.match(prompt.question.strip()))), None)
    if plan is None:
        return reply("<answer> unknown </answer>", "I do not know how to research this question.")
    entity, hops = plan
    for result, (_, pattern) in zip(prompt.tool_results(), hops, strict=False):
        fact = read_fact(result, entity, pattern)
        if fact is None:
            return reply("<answer> unknown </answer>", f"The search did not say what I need about {entity}.")
        entity = fact
    done = len(prompt.tool_results())
    if done >= len(hops):
        return reply(f"<answer> {entity} </answer>", f"The passage says {entity}.")
    keywords = hops[done][0]
    thought = f"I need to look up {entity}." if done == 0 else f"That points to {entity}; search for it next."
    return tool_call("local_search", {"query": f"{entity} {keywords}"}, thought)


@dataclass(frozen=True)
class Episode:
    question: str
    golden_answers: list[str]
    answer: str | None
    reward: float
    queries: list[str]
    gold_passages_found: bool  # every supporting passage was among the search results


@dataclass(frozen=True)
class SmokeResult:
    episodes: list[Episode]
    streamed: list[str]


async def run_smoke(count: int = 12, *, out: bool = True) -> SmokeResult:
    recipe = load_recipe(RECIPE_PATH)
    runtime = runtime_for(recipe, scripted_engine(policy))
    rows = list(recipe.rows("test"))[:count]
    say = print if out else (lambda _: None)
    passages = {d["id"]: d["text"] for d in map(json.loads, CORPUS_PATH.read_text(encoding="utf-8").splitlines())}

    two_hop = next(row for row in rows if row["data_source"] == "hotpotqa")
    say(f"== {recipe.name}: streaming one two-hop episode ==\nuser: {two_hop['prompt']}")
    streamed = []
    async for event in runtime.stream(two_hop["prompt"], task=two_hop):
        streamed.append(describe(event))
        say("  " + streamed[-1])

    results = await runtime.run_many([row["prompt"] for row in rows], tasks=rows)
    episodes = []
    for row, result in zip(rows, results, strict=True):
        messages = result.trajectory.messages
        calls = [c for m in messages if m.role == "assistant" for c in m.tool_calls]
        seen = "\n".join(str(m.content) for m in messages if m.role == "tool")
        episode = Episode(
            question=row["prompt"],
            golden_answers=row["references"],
            answer=result.final_answer,
            reward=result.reward,
            queries=[str(c.arguments.get("query")) for c in calls],
            gold_passages_found=all(passages[i] in seen for i in row["supporting_ids"]),
        )
        episodes.append(episode)
        say(
            f"  [{row['data_source']:8s}] {episode.question[:64]:64s} -> {episode.answer} "
            f"(gold {episode.golden_answers[0]}) EM={episode.reward:.0f} searches={len(calls)} "
            f"gold passages found={episode.gold_passages_found}"
        )
    mean = sum(e.reward for e in episodes) / len(episodes)
    say(f"== {len(episodes)} episodes, exact match {mean:.2f} ==")
    return SmokeResult(episodes=episodes, streamed=streamed)


def main() -> int:
    quiet_logs()
    result = asyncio.run(run_smoke())
    return 0 if all(e.reward == 1.0 for e in result.episodes) else 1


if __name__ == "__main__":
    sys.exit(main())
