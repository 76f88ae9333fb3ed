"""The chat template the demo model directory carries is the format of the demo recipe's protocol, so a demo
model served without its recipe gets the same protocol, and the package needs nothing from the training layer."""

from __future__ import annotations

import subprocess
import sys

from agent_demo import DEMO_PROTOCOL, chat_template, make_recipe
from agent_protocol import protocol_for_template


def test_the_template_is_the_recipes_protocol() -> None:
    assert protocol_for_template(chat_template(), "qwen3") == DEMO_PROTOCOL == make_recipe().protocol


def test_serving_the_demo_imports_no_training_layer() -> None:
    code = (
        "import sys, agent_demo; from agent_runtime import load_recipe; load_recipe('agent_demo.recipe'); "
        "print(sorted(m for m in ('agent_train', 'torch', 'openrlhf', 'vllm') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"
