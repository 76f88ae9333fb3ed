"""The embedded demo agent: a synthetic tool-use task, its tokenizer, its tiny Qwen3 model, its recipe and the
cache where the trained model lives.

- `task`: arithmetic ``a * b +/- c`` that needs the ``calculator`` tool; `generate_problems`, train / held-out.
- `expert`: `ExpertPolicy`, the scripted expert (a `ScriptedEngine` policy) that produces SFT data.
- `tokenizer`: `train_demo_tokenizer`, a byte-level BPE carrying Qwen3's special tokens.
- `model`: `DemoModelSpec`, `build_demo_model`, `save_model_dir` (imports torch; not imported here).
- `recipe`: the demo `Recipe` (`load_recipe("agent_train.demo.recipe")`).
- `build`: `find_demo_model`, `ensure_demo_model` (what `apps/serve` calls), `demo_home`.

Importing this package does not import torch.
"""

from agent_train.demo.build import (
    DEMO_BUILD,
    demo_home,
    demo_model_dir,
    ensure_demo_model,
    find_demo_model,
    install_demo_model,
)
from agent_train.demo.expert import ExpertPolicy, expert_turn
from agent_train.demo.recipe import make_recipe
from agent_train.demo.task import Problem, generate_problems, parse_question, problem_rows, split_of
from agent_train.demo.tokenizer import QWEN3_ADDED_TOKENS, episode_text, train_demo_tokenizer

__all__ = [
    "DEMO_BUILD",
    "QWEN3_ADDED_TOKENS",
    "ExpertPolicy",
    "Problem",
    "demo_home",
    "demo_model_dir",
    "ensure_demo_model",
    "episode_text",
    "expert_turn",
    "find_demo_model",
    "generate_problems",
    "install_demo_model",
    "make_recipe",
    "parse_question",
    "problem_rows",
    "split_of",
    "train_demo_tokenizer",
]
