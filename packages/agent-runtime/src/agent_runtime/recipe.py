"""`Recipe`: an agent defined once, in one Python file, loaded by both `apps/train` and `apps/serve`.

    # my_agent.py
    from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline
    from agent_runtime import Recipe

    recipe = Recipe(
        name="calculator-agent",
        protocol="qwen3",
        environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=6),
        rewards=RewardPipeline(result=[MatchingReward()]),
        max_new_tokens=512,
        max_context_tokens=8192,
        dataset="data/train.jsonl",          # rows: {"prompt": "...", "answer": "..."}
    )

The protocol, the environment factory, the reward pipeline, budgets, the context policy (`context=`: the plain
budget, `CompactionPolicy(...)`, or a `ContextPolicy` of one's own, see `agent_runtime.context_policy`) and the
dataset are all here; `make_session()` turns them into the `AgentSession` that serving and training run. A
recipe file may instead define `make_recipe()` returning a Recipe. A recipe may name an agent program written
against the OpenAI API instead (`agent=AgentProgram(fn)`, see `agent_runtime.agent_program`), trained through a
per-episode proxy. This module knows sessions and how to import
a file; it knows nothing about OpenRLHF or HTTP.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

from agent_env import Environment, FunctionCallEnvironment, RewardPipeline
from agent_protocol import ChatProtocol, Tokenizer, get_protocol
from agent_runtime.agent_program import AgentProgram
from agent_runtime.context_policy import (
    DEFAULT_COMPACTION_INSTRUCTION,
    DEFAULT_RESUME_TEMPLATE,
    BudgetPolicy,
    CompactionPolicy,
    ContextPolicy,
)
from agent_runtime.engines.base import SamplingParams
from agent_runtime.session import AgentSession

__all__ = ["Compaction", "Recipe", "RecipeError", "iter_jsonl", "load_recipe", "read_jsonl_rows"]

DatasetSource = str | Path | Callable[[str], Iterable[Mapping[str, Any]]] | None


class RecipeError(ValueError):
    """A recipe cannot be loaded or is malformed; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Compaction:
    """Deprecated: compaction settings, for `Recipe(compaction=...)`. Write `Recipe(context=CompactionPolicy(...))`
    (the same fields; `instruction` is `instruction_text` there)."""

    compact_at_tokens: int | None = None
    max_compactions: int = 3
    summary_max_new_tokens: int = 512
    instruction: str = DEFAULT_COMPACTION_INSTRUCTION
    resume_template: str = DEFAULT_RESUME_TEMPLATE

    def policy(self) -> CompactionPolicy:
        """The `CompactionPolicy` these settings spell."""
        return CompactionPolicy(
            compact_at_tokens=self.compact_at_tokens,
            max_compactions=self.max_compactions,
            summary_max_new_tokens=self.summary_max_new_tokens,
            instruction_text=self.instruction,
            resume_template=self.resume_template,
        )


@dataclass(frozen=True)
class Recipe:
    """An agent definition. `environment` is a factory: every episode gets a fresh environment.

    `dataset` is a JSONL path (rows with "prompt" as a string or a message list, and "answer"/"label"/"references"
    for rewards), a directory holding `<split>.jsonl` files, or a callable `split -> rows`.

    `agent` makes this an agent-program recipe (`AgentProgram`): training runs that program against a per-episode
    OpenAI endpoint of the policy (`agent_runtime.proxy`) instead of this recipe's session, and scores it with
    `rewards`. `environment` then only matters where the recipe's own session runs (serving's agent mode, the
    local trainer's evaluation); it defaults to no tools.

    `context` is what an episode does as its context grows (`agent_runtime.context_policy`): `BudgetPolicy()` (the
    default) ends it when the context is full, `CompactionPolicy(...)` summarizes and goes on, and a subclass of
    `ContextPolicy` does what it decides. `compaction=Compaction(...)` is the deprecated spelling of
    `context=CompactionPolicy(...)`: an init-only argument that, given (also to `dataclasses.replace`), sets
    `context`; `recipe.compaction` reads None (read `recipe.context`).
    """

    name: str
    environment: Callable[[], Environment] = FunctionCallEnvironment
    protocol: str | ChatProtocol = "qwen3"
    protocol_options: Mapping[str, Any] = field(default_factory=dict)
    rewards: RewardPipeline | None = None
    system_prompt: str | None = None
    max_new_tokens: int = 1024
    max_context_tokens: int | None = None
    #: the most images one context may hold (OpenRLHF's ``--data.max_images_per_prompt``); None: no limit here
    max_images: int | None = None
    #: True: user and tool text is tokenized as Hugging Face does, so a control string in it (``<|im_end|>``,
    #: ``<tool_call>``) becomes the control token; False (default): it stays text (`agent_protocol.control_tokens`)
    special_tokens_in_text: bool = False
    compaction: InitVar[Compaction | None] = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    dataset: DatasetSource = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    agent: AgentProgram | None = None
    context: ContextPolicy = field(default_factory=BudgetPolicy)

    def __post_init__(self, compaction: Compaction | None) -> None:
        if not isinstance(self.context, ContextPolicy):
            raise RecipeError(f"recipe {self.name!r}: context is a {type(self.context).__name__}, not a ContextPolicy")
        if compaction is not None:
            warnings.warn(
                "Recipe(compaction=Compaction(...)) is deprecated; write Recipe(context=CompactionPolicy(...))",
                DeprecationWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "context", compaction.policy())

    def chat_protocol(self) -> ChatProtocol:
        if isinstance(self.protocol, ChatProtocol):
            return self.protocol
        return get_protocol(self.protocol, **dict(self.protocol_options))

    def make_session(self, tokenizer: Tokenizer | str | Path | None = None) -> AgentSession:
        """The session this recipe defines, under its context policy."""
        return AgentSession(
            self.chat_protocol(),
            self.environment,
            self.rewards,
            tokenizer,
            max_new_tokens=self.max_new_tokens,
            max_context_tokens=self.max_context_tokens,
            system_prompt=self.system_prompt,
            context=self.context,
            max_images=self.max_images,
            special_tokens_in_text=self.special_tokens_in_text,
        )

    def generation_cap(self) -> int:
        """The most new tokens one generation of this recipe's episodes asks for: a turn's, or more where the
        context policy asks for longer summaries (the sampling cap to give a runtime)."""
        return self.context.generation_cap(self.max_new_tokens)

    def rows(self, split: str = "train") -> Iterator[dict[str, Any]]:
        """The dataset rows of `split`; each has at least "prompt"."""
        source = self.dataset
        if source is None:
            raise RecipeError(f"recipe {self.name!r} defines no dataset")
        if callable(source):
            for index, row in enumerate(source(split)):
                yield _checked_row(dict(row), f"{self.name}:{split}[{index}]")
            return
        path = Path(source)
        if path.is_dir():
            path = path / f"{split}.jsonl"
        yield from read_jsonl_rows(path)


def _checked_row(row: dict[str, Any], where: str) -> dict[str, Any]:
    prompt = row.get("prompt")
    if not isinstance(prompt, (str, list)) or not prompt:
        raise RecipeError(f"{where}: a dataset row needs a non-empty 'prompt' (a string or a list of messages)")
    return row


def iter_jsonl(
    path: str | Path, error: Callable[[str], Exception] = RecipeError
) -> Iterator[tuple[str, dict[str, Any]]]:
    """`("file:line", row)` for every JSON object line of a JSONL file; blank lines are skipped. A missing file,
    a line that is not JSON or not an object raises `error(message)`, the message naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise error(f"dataset file {path} does not exist")
    with path.open(encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from e
            if not isinstance(row, dict):
                raise error(f"{where}: a row must be a JSON object, got {type(row).__name__}")
            yield where, row


def read_jsonl_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL dataset file, each checked to carry a prompt; errors name the file and line."""
    for where, row in iter_jsonl(path):
        yield _checked_row(row, where)


def load_recipe(source: str | Path) -> Recipe:
    """Load a recipe from a `.py` file path or a module path (`package.module`, or `package.module:attr`).

    The file defines `recipe` (a `Recipe`) or `make_recipe()` returning one."""
    text = str(source)
    attr: str | None = None
    if ":" in text and not Path(text).exists():
        text, attr = text.rsplit(":", 1)
    path = Path(text)
    if text.endswith(".py") or path.exists():
        if not path.is_file():
            raise RecipeError(f"recipe file {path} does not exist")
        module_name = f"_agent_recipe_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise RecipeError(f"cannot import recipe file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise RecipeError(f"recipe file {path} failed to import: {type(e).__name__}: {e}") from e
    else:
        try:
            module = importlib.import_module(text)
        except ImportError as e:
            raise RecipeError(f"cannot import recipe module {text!r}: {e}") from e
    candidates = [attr] if attr else ["recipe", "make_recipe", "RECIPE"]
    for name in candidates:
        value = getattr(module, name, None)
        if value is None:
            continue
        if callable(value) and not isinstance(value, Recipe):
            value = value()
        if not isinstance(value, Recipe):
            raise RecipeError(f"{source}: {name} is a {type(value).__name__}, not a Recipe")
        return value
    raise RecipeError(f"{source} defines no recipe: add `recipe = Recipe(...)` or `def make_recipe() -> Recipe`")
