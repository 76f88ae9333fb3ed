"""``examples/any_agent``: the plain OpenAI-client agent trained in the local trainer's CPU smoke mode.

- `ProgramRollouts` (the program through the proxy) gives the local trainer exactly the records `Rollouts` gives
  for the equivalent recipe (the demo's own session), on the `hf` engine with the same seeds (logprobs up to the
  float rounding of different batch shapes);
- the smoke run (`examples.any_agent.train.SMOKE`: the local trainer's warm start, then RL whose every rollout
  is the program on a real `openai.AsyncOpenAI`) raises the program's held-out sampled reward. Measured (seed 0,
  48 held-out problems x 2 samples, same seeds before and after) in ``examples/any_agent/README.md``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import msgspec
import pytest

pytest.importorskip("torch")

from agent_demo.recipe import make_recipe as demo_recipe
from agent_protocol import HFTokenizer
from agent_runtime.engines.hf import HFEngine
from agent_train.demo.model import load_demo_model
from agent_train.local.lockstep import LockstepEngine
from agent_train.local.program_rollouts import ProgramRollouts
from agent_train.local.rollout import Rollouts
from examples.any_agent.recipe import make_recipe
from examples.any_agent.train import SMOKE, train_any_agent
from tests.support.tiny_demo import save_tiny_demo_model

MIN_GAIN = 0.05  # held-out sampled reward, after RL minus before; see the README for the measured runs


def test_the_example_recipe_is_the_demo_recipe_with_a_program() -> None:
    recipe, demo = make_recipe(), demo_recipe()
    assert recipe.agent is not None
    assert dataclasses.replace(recipe, name=demo.name, agent=None) == dataclasses.replace(demo, rewards=recipe.rewards)


def test_program_rollouts_are_the_recipe_rollouts(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    model_dir = save_tiny_demo_model(tmp_path / "tiny")
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    recipe = make_recipe()
    rows = list(recipe.rows("test"))[:4]

    async def both() -> tuple[list[object], list[object]]:
        # in lockstep, as the example trains: the program's requests, made on its own thread and handed to the
        # rollout's loop, still belong to their episode and go in its waves (none passes straight through)
        engine = LockstepEngine(
            HFEngine(load_demo_model(model_dir), HFTokenizer(raw, source="demo"), context_length=512)
        )
        try:
            plain = await Rollouts(dataclasses.replace(recipe, agent=None), engine).collect(
                rows, group_size=2, temperature=0.0, seed=3
            )
            waves = engine.waves
            program = await ProgramRollouts(recipe, engine).collect(rows, group_size=2, temperature=0.0, seed=3)
            assert engine.waves > waves > 0 and engine.passed_through == 0
        finally:
            await engine.close()
        return list(plain), list(program)

    plain, program = asyncio.run(both())
    assert len(plain) == len(program) == 8
    for ours, theirs in zip(program, plain, strict=True):  # logprobs up to float rounding between batch shapes
        assert ours.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
        unchanged = {"extra_logs": {}, "logprobs": [], "trajectory": None}  # the records' own episode ids, timings
        assert msgspec.structs.asdict(ours) | unchanged == msgspec.structs.asdict(theirs) | unchanged


def test_the_plain_agent_learns_through_the_proxy(tmp_path: Path) -> None:
    result = train_any_agent(tmp_path, SMOKE, seed=0)
    assert result.segments_per_episode == 1.0  # the plain loop echoes every turn back: no prefix break
    assert result.after >= result.before + MIN_GAIN, result
