"""Build the search_r1 example's data from templates and one seed: a corpus of short encyclopedia passages about
fictional seas, rivers, towns, organisations and people, and question sets in the NQ/HotpotQA JSONL shape.

    uv run python -m examples.search_r1.build_data            # (re)write data/*.jsonl, byte for byte the same
    uv run python -m examples.search_r1.build_data --check    # exit 1 when the committed files differ

The entities are invented, so no model knows the answers: an agent can only find them by searching. Questions
are single-hop (NQ-style: "Where was Velor Ashtane born?") or two-hop (HotpotQA-style: "Which river flows
through the birthplace of Velor Ashtane?"). Every row names the passages that support it (`supporting_ids`).

Files: `corpus.jsonl` rows ``{"id", "title", "text"}`` (what `SearchIndex.from_jsonl` reads), `train.jsonl` and
`test.jsonl` rows ``{"id", "question", "golden_answers", "data_source", "supporting_ids"}``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

DATA_DIR: Final = Path(__file__).with_name("data")
SEED: Final = 2024
COUNTS: Final = {"sea": 8, "river": 150, "town": 600, "org": 400, "person": 1850}
SPLIT_SIZES: Final = {"train": 1000, "test": 200}

_ONSETS: Final = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "br", "dr", "kr", "st")
_VOWELS: Final = ("a", "e", "i", "o", "u", "ae", "ia", "ou")
_CODAS: Final = ("", "", "n", "r", "l", "s", "th", "nd", "rk", "sh")
_PROFESSIONS: Final = (
    "botanist",
    "cartographer",
    "composer",
    "engineer",
    "astronomer",
    "poet",
    "architect",
    "glassmaker",
    "chemist",
    "painter",
    "physician",
    "shipwright",
    "historian",
    "weaver",
)
_ORG_KINDS: Final = ("Institute", "Company", "Society", "Observatory", "Foundry", "Press", "Guild", "Academy")
_KNOWN_FOR: Final = (
    "a survey of the northern marshes",
    "a treatise on tidal mills",
    "the first map of the inner lakes",
    "a cycle of winter songs",
    "an improved loom",
    "a catalogue of comets",
    "the stone bridge at the old ford",
    "a method for clear green glass",
    "a study of fever in river ports",
    "a history of the salt trade",
)


@dataclass
class Entity:
    id: str
    kind: str
    name: str
    facts: dict[str, Any] = field(default_factory=dict)


class World:
    """The fictional world: every entity with its facts, and the passage that states them."""

    def __init__(self, seed: int = SEED) -> None:
        self.rng = random.Random(seed)
        self._used: set[str] = set()
        self.entities: list[Entity] = []
        rng = self.rng
        self.seas = [self._add("sea", f"{self._word()} Sea") for _ in range(COUNTS["sea"])]
        self.rivers = [
            self._add(
                "river",
                self._word(),
                sea=rng.choice(self.seas).name,
                length=rng.randint(40, 900),
                mountains=f"{self._word()} Hills",
            )
            for _ in range(COUNTS["river"])
        ]
        regions = [self._word() for _ in range(20)]
        self.towns = [
            self._add(
                "town",
                self._word(),
                river=rng.choice(self.rivers).name,
                region=rng.choice(regions),
                year=rng.randint(900, 1800),
                population=rng.randint(2, 400) * 500,
            )
            for _ in range(COUNTS["town"])
        ]
        first_names = [self._word(2) for _ in range(80)]
        self.people = [
            self._add(
                "person",
                f"{rng.choice(first_names)} {self._word()}",
                year=rng.randint(1700, 1960),
                town=rng.choice(self.towns).name,
                profession=rng.choice(_PROFESSIONS),
                known_for=rng.choice(_KNOWN_FOR),
                worked_in=rng.choice(self.towns).name,
            )
            for _ in range(COUNTS["person"])
        ]
        founders = rng.sample(self.people, COUNTS["org"])
        self.orgs = []
        for founder in founders:
            year = founder.facts["year"] + rng.randint(20, 50)
            org = self._add(
                "org",
                f"{self._word()} {rng.choice(_ORG_KINDS)}",
                year=year,
                founder=founder.name,
                town=rng.choice(self.towns).name,
            )
            founder.facts["founded"] = org.name
            self.orgs.append(org)
        self.by_name = {e.name: e for e in self.entities}

    def _word(self, syllables: int | None = None) -> str:
        while True:
            count = syllables or self.rng.choice((2, 2, 3))
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(count)]
            word = ("".join(parts) + self.rng.choice(_CODAS)).capitalize()
            if word not in self._used and len(word) >= 4:
                self._used.add(word)
                return word

    def _add(self, kind: str, name: str, **facts: Any) -> Entity:
        entity = Entity(id=f"doc-{len(self.entities):05d}", kind=kind, name=name, facts=facts)
        self.entities.append(entity)
        return entity

    def passage(self, e: Entity) -> str:
        """The encyclopedia passage about `e`; each template states the same key phrases the questions need."""
        f, pick = e.facts, random.Random(f"{SEED}-{e.id}").randrange(3)
        if e.kind == "sea":
            return f"The {e.name} is an inland sea. Many rivers of the region flow into the {e.name}."
        if e.kind == "river":
            return (
                f"The {e.name} River rises in the {f['mountains']} and flows {f['length']} kilometres into the "
                f"{f['sea']}.",
                f"The {e.name} River is a river of {f['length']} km. From the {f['mountains']} it runs into the "
                f"{f['sea']}, passing mills and ferry landings.",
                f"Rising in the {f['mountains']}, the {e.name} River flows into the {f['sea']}; it is "
                f"{f['length']} kilometres long and navigable in its lower course.",
            )[pick]
        if e.kind == "town":
            return (
                f"{e.name} is a town in the region of {f['region']}, on the {f['river']} River. It was founded in "
                f"{f['year']} and has about {f['population']} inhabitants.",
                f"Founded in {f['year']}, {e.name} lies on the {f['river']} River in {f['region']}. The town is "
                f"known for its market and has about {f['population']} inhabitants.",
                f"{e.name} ({f['population']} inhabitants) is an old market town on the {f['river']} River. It was "
                f"founded in {f['year']} and belongs to the region of {f['region']}.",
            )[pick]
        if e.kind == "org":
            return (
                f"The {e.name} is an institution founded in {f['year']} by {f['founder']}. It is headquartered in "
                f"{f['town']}.",
                f"Headquartered in {f['town']}, the {e.name} was founded in {f['year']} by {f['founder']} and is "
                f"still active today.",
                f"The {e.name} was founded in {f['year']} by {f['founder']}. Its first workshop stood in "
                f"{f['town']}, where it is still headquartered.",
            )[pick]
        founded = f" In later life the {f['profession']} founded the {f['founded']}." if "founded" in f else ""
        return (
            f"{e.name} was a {f['profession']}, born in {f['town']} in {f['year']}. {e.name.split()[0]} is best "
            f"known for {f['known_for']} and worked for many years in {f['worked_in']}.",
            f"{e.name} (born in {f['town']} in {f['year']}) was a {f['profession']} who worked in {f['worked_in']} "
            f"and is remembered for {f['known_for']}.",
            f"Born in {f['town']} in {f['year']}, {e.name} became a {f['profession']}. Their best known work is "
            f"{f['known_for']}; they later settled in {f['worked_in']}.",
        )[pick] + founded

    def corpus(self) -> list[dict[str, str]]:
        return [{"id": e.id, "title": self.title(e), "text": self.passage(e)} for e in self.entities]

    @staticmethod
    def title(e: Entity) -> str:
        return f"{e.name} River" if e.kind == "river" else e.name


def _river(name: str) -> list[str]:
    return [name, f"{name} River"]


# Question kinds: (data_source, builder). A builder picks an entity and returns (question, answers, supporting).
Question = tuple[str, list[str], list[Entity]]


def _questions(world: World) -> list[tuple[str, Callable[[random.Random], Question]]]:
    w = world

    def person(rng: random.Random) -> Entity:
        return rng.choice(w.people)

    def birthplace(rng: random.Random) -> Question:
        p = person(rng)
        return f"Where was {p.name} born?", [p.facts["town"]], [p]

    def birth_year(rng: random.Random) -> Question:
        p = person(rng)
        return f"In what year was {p.name} born?", [str(p.facts["year"])], [p]

    def org_year(rng: random.Random) -> Question:
        o = rng.choice(w.orgs)
        return f"In what year was the {o.name} founded?", [str(o.facts["year"])], [o]

    def founder(rng: random.Random) -> Question:
        o = rng.choice(w.orgs)
        return f"Who founded the {o.name}?", [o.facts["founder"]], [o]

    def town_river(rng: random.Random) -> Question:
        t = rng.choice(w.towns)
        return f"Which river flows through {t.name}?", _river(t.facts["river"]), [t]

    def birthplace_river(rng: random.Random) -> Question:
        p = person(rng)
        t = w.by_name[p.facts["town"]]
        return f"Which river flows through the birthplace of {p.name}?", _river(t.facts["river"]), [p, t]

    def town_sea(rng: random.Random) -> Question:
        t = rng.choice(w.towns)
        r = w.by_name[t.facts["river"]]
        return f"Into which sea does the river of {t.name} flow?", [r.facts["sea"]], [t, r]

    def founder_birthplace(rng: random.Random) -> Question:
        o = rng.choice(w.orgs)
        p = w.by_name[o.facts["founder"]]
        return f"In which town was the founder of the {o.name} born?", [p.facts["town"]], [o, p]

    single: list[Callable[[random.Random], Question]] = [birthplace, birth_year, org_year, founder, town_river]
    double: list[Callable[[random.Random], Question]] = [birthplace_river, town_sea, founder_birthplace]
    return [("nq", b) for b in single] + [("hotpotqa", b) for b in double]


def question_sets(world: World) -> dict[str, list[dict[str, Any]]]:
    """The question set of each split: alternately single-hop and two-hop, no question in two splits."""
    kinds = _questions(world)
    single = [k for k in kinds if k[0] == "nq"]
    double = [k for k in kinds if k[0] == "hotpotqa"]
    seen: set[str] = set()
    sets: dict[str, list[dict[str, Any]]] = {}
    for split in ("test", "train"):
        rng = random.Random(f"{SEED}-{split}")
        rows: list[dict[str, Any]] = []
        while len(rows) < SPLIT_SIZES[split]:
            source, build = rng.choice(single if len(rows) % 2 == 0 else double)
            question, answers, support = build(rng)
            if question in seen:
                continue
            seen.add(question)
            rows.append(
                {
                    "id": f"{split}-{len(rows):04d}",
                    "question": question,
                    "golden_answers": answers,
                    "data_source": source,
                    "supporting_ids": [e.id for e in support],
                }
            )
        sets[split] = rows
    return sets


def render(rows: Sequence[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def build() -> dict[str, str]:
    """Every data file's name and text."""
    world = World()
    sets = question_sets(world)
    return {
        "corpus.jsonl": render(world.corpus()),
        "test.jsonl": render(sets["test"]),
        "train.jsonl": render(sets["train"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    args = parser.parse_args(argv)
    files = build()
    stale = [
        name
        for name, text in files.items()
        if not (DATA_DIR / name).is_file() or (DATA_DIR / name).read_text(encoding="utf-8") != text
    ]
    if args.check:
        print("stale: " + ", ".join(stale) if stale else "data files are up to date")
        return 1 if stale else 0
    DATA_DIR.mkdir(exist_ok=True)
    for name, text in files.items():
        (DATA_DIR / name).write_text(text, encoding="utf-8")
        print(f"wrote {DATA_DIR / name} ({len(text.encode()) / 1e6:.2f} MB, {text.count(chr(10))} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
