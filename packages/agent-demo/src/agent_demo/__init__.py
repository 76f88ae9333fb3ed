"""agent-demo: the project's embedded demo agent, everything needed to serve it and nothing that trains it.

- `task`: arithmetic ``a * b +/- c`` that needs the ``calculator`` tool; `generate_problems`, train / held-out.
- `recipe`: the demo `Recipe` (`load_recipe("agent_demo.recipe")`), served by `apps/serve` when no model is named.
- `expert`: `ExpertPolicy`, the scripted expert (a `ScriptedEngine` policy) that produces supervised data.
- `tokenizer`: `train_demo_tokenizer`, a byte-level BPE carrying Qwen3's special tokens.
- `chat_template`: the Qwen3-Instruct-2507 chat template the demo model directory carries.
- `running_total`, `running_total_expert`: the compaction demo (`running_total_recipe`, `RunningTotalExpert`): adding
  up a list one calculator call at a time, in a context that holds only part of the episode.

The demo model itself (its shape, building, training and cache) is agent-train's (`agent_train.demo`), which
imports this package. Importing this package does not import torch.
"""

from importlib.metadata import version as _version

from agent_demo.chat_template import DEMO_CHAT_TEMPLATE, chat_template
from agent_demo.expert import ExpertPolicy, expert_turn
from agent_demo.recipe import DEMO_PROTOCOL, make_recipe
from agent_demo.running_total import make_recipe as running_total_recipe
from agent_demo.running_total_expert import RunningTotalExpert, train_running_total_tokenizer
from agent_demo.task import Problem, generate_problems, parse_question, problem_rows, split_of
from agent_demo.tokenizer import QWEN3_ADDED_TOKENS, episode_text, train_demo_tokenizer

__all__ = [
    "DEMO_CHAT_TEMPLATE",
    "DEMO_PROTOCOL",
    "QWEN3_ADDED_TOKENS",
    "ExpertPolicy",
    "Problem",
    "RunningTotalExpert",
    "__version__",
    "chat_template",
    "episode_text",
    "expert_turn",
    "generate_problems",
    "make_recipe",
    "parse_question",
    "problem_rows",
    "running_total_recipe",
    "split_of",
    "train_demo_tokenizer",
    "train_running_total_tokenizer",
]

__version__ = _version("agent-demo")
