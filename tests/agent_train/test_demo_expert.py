"""The scripted expert plays through the recipe's own `AgentSession`: it solves every plain phrasing with its plan
and one calculator call, then a copied answer, refuses word problems (so SFT never shows one), and its episodes
become SFT examples whose loss mask covers exactly the turns it generated."""

from __future__ import annotations

import asyncio

from agent_demo.expert import PLAN_ADD, PLAN_SUBTRACT, REFUSAL, ExpertPolicy, expert_turn
from agent_demo.recipe import make_recipe
from agent_demo.task import generate_problems
from agent_demo.tokenizer import train_demo_tokenizer
from agent_protocol import HFTokenizer
from agent_train.local.sft import expert_trajectories, sft_examples

RECIPE = make_recipe()
PROTOCOL = RECIPE.chat_protocol()


def test_expert_turns_are_rendered_by_the_protocol() -> None:
    prompt = PROTOCOL.render_prompt([{"role": "user", "content": "What is 1234 * 56 + 7?"}])
    call = expert_turn(prompt, PROTOCOL)
    assert call == (
        "Step 1: multiply. Step 2: add.\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1234 * 56 + 7"}}\n</tool_call><|im_end|>'
    )
    minus = PROTOCOL.render_prompt([{"role": "user", "content": "Compute 1234 times 56, then subtract 7."}])
    assert expert_turn(minus, PROTOCOL).startswith(f"{PLAN_SUBTRACT}\n<tool_call>\n")
    assert '"1234 * 56 - 7"' in expert_turn(minus, PROTOCOL)
    feedback = PROTOCOL.render_feedback([{"role": "tool", "content": "69111", "tool_call_id": "c"}])
    assert expert_turn(prompt + call + feedback, PROTOCOL) == "The answer is 69111.<|im_end|>"
    failed = PROTOCOL.render_feedback([{"role": "tool", "content": "Error: division by zero", "tool_call_id": "c"}])
    assert expert_turn(prompt + call + failed, PROTOCOL) == f"{REFUSAL}<|im_end|>"
    word = PROTOCOL.render_prompt([{"role": "user", "content": "A baker bakes 12 trays of 34 rolls and sells 5 rolls. "
                                                               "How many rolls are left?"}])  # fmt: skip
    assert expert_turn(word, PROTOCOL) == f"{REFUSAL}<|im_end|>"
    assert expert_turn(word, PROTOCOL, phrasings=("plain", "word")).startswith(f"{PLAN_SUBTRACT}\n<tool_call>")
    assert "12 * 34 - 5" in expert_turn(word, PROTOCOL, phrasings=("plain", "word"))
    assert expert_turn(PROTOCOL.render_prompt([{"role": "user", "content": "Hi!"}]), PROTOCOL) == f"{REFUSAL}<|im_end|>"


def test_expert_episodes_through_the_session_become_sft_examples() -> None:
    tok = HFTokenizer(train_demo_tokenizer(PROTOCOL, RECIPE.environment().tools, episodes=500))
    problems = generate_problems("train", 80, seed=2)
    rows = [p.row() for p in problems]
    trajectories = asyncio.run(expert_trajectories(RECIPE, tok, rows, ExpertPolicy(tok, PROTOCOL)))
    for problem, trajectory in zip(problems, trajectories, strict=True):
        if problem.phrasing == "plain":
            assert trajectory.reward == 1.0 and trajectory.tool_calls == 1 and trajectory.turns == 2
            assert trajectory.final_answer == f"The answer is {problem.answer}." and not trajectory.errors
        else:
            assert trajectory.reward == 0.0 and trajectory.tool_calls == 0 and trajectory.final_answer is not None
    examples = sft_examples(trajectories)
    assert len(examples) == sum(p.phrasing == "plain" for p in problems) > 20
    for example in examples:
        trained = [i for i, m in zip(example.ids, example.loss_mask, strict=True) if m]
        text = tok.decode(trained)
        assert text.startswith((f"{PLAN_ADD}\n<tool_call>\n", f"{PLAN_SUBTRACT}\n<tool_call>\n"))
        assert text.endswith(".<|im_end|>")
        assert text.count("<|im_end|>") == 2 and "<tool_response>" not in text  # the tool's result is not trained
