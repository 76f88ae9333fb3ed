"""The demo agents the local trainer knows, by name: what it needs of each (the recipe, the tokenizer trained on
its episodes, the scripted expert that gives SFT data) and its presets.

    demo = get_demo("compaction")          # or "calculator", the default
    recipe = demo.make_recipe()
    config = demo.presets["ci"]

- ``calculator``: `agent_demo.recipe`, arithmetic through the calculator in one call (the default demo, which
  `apps/serve` serves when no model is named);
- ``compaction``: `agent_demo.running_total`, a running total over a list too long for the context, carried
  through summaries (compaction), every segment trained with the episode's advantage.

This module knows the agent-demo package and the presets' numbers; the training is `trainer.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec
from tokenizers import Tokenizer

from agent_demo import (
    ExpertPolicy,
    RunningTotalExpert,
    running_total_recipe,
    train_demo_tokenizer,
    train_running_total_tokenizer,
)
from agent_demo import make_recipe as calculator_recipe
from agent_protocol import ChatProtocol, ToolSpecLike
from agent_protocol import Tokenizer as TextTokenizer
from agent_runtime import Recipe
from agent_runtime.engines import Policy
from agent_train.local.config import PRESETS, LocalTrainConfig

__all__ = ["DEMOS", "Demo", "get_demo"]

TokenizerTrainer = Callable[..., Tokenizer]
"""``(protocol, tools, *, vocab_size, episodes, seed) -> tokenizers.Tokenizer``."""


@dataclass(frozen=True)
class Demo:
    """One demo agent: its recipe, tokenizer, expert and presets (``default`` and ``ci``)."""

    name: str
    summary: str
    plot_title: str
    make_recipe: Callable[[], Recipe]
    train_tokenizer: TokenizerTrainer
    expert: Callable[[TextTokenizer, ChatProtocol], Policy]
    presets: Mapping[str, LocalTrainConfig]

    def tokenizer(self, protocol: ChatProtocol, tools: Sequence[ToolSpecLike], config: LocalTrainConfig) -> Tokenizer:
        return self.train_tokenizer(
            protocol, tools, vocab_size=config.vocab_size, episodes=config.tokenizer_episodes, seed=config.seed
        )


_COMPACTION_DEFAULT: Final = LocalTrainConfig(
    demo="compaction",
    tokenizer_episodes=2000,
    sft_episodes=2000,
    sft_steps=500,
    rl_steps=30,
    rl_prompts=8,
    rl_group_size=8,
    eval_size=200,
    sft_eval_every=100,
    eval_every=10,
)

DEMOS: Final[dict[str, Demo]] = {
    "calculator": Demo(
        name="calculator",
        summary="arithmetic a * b +/- c through one calculator call (agent_demo.recipe; the default)",
        plot_title="demo agent",
        make_recipe=calculator_recipe,
        train_tokenizer=train_demo_tokenizer,
        expert=ExpertPolicy,
        presets=PRESETS,
    ),
    "compaction": Demo(
        name="compaction",
        summary="a running total over a list too long for the context, carried through summaries "
        "(agent_demo.running_total)",
        plot_title="compaction demo: a running total carried through summaries",
        make_recipe=running_total_recipe,
        train_tokenizer=train_running_total_tokenizer,
        expert=RunningTotalExpert,
        presets={
            "default": _COMPACTION_DEFAULT,
            "ci": msgspec.structs.replace(
                _COMPACTION_DEFAULT, sft_steps=400, rl_steps=12, eval_size=100, sft_eval_every=1000, eval_every=6
            ),
        },
    ),
}


def get_demo(name: str) -> Demo:
    """The demo called `name` (``calculator`` or ``compaction``)."""
    try:
        return DEMOS[name]
    except KeyError:
        raise ValueError(f"unknown demo {name!r}; choose one of {', '.join(DEMOS)}") from None
