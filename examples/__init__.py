"""Runnable examples: each folder is a recipe, a README and a CPU smoke mode.

Run a smoke mode from the repository root: ``uv run python -m examples.<name>.smoke`` (qwen3, search_r1,
single_turn, compact). The smoke modes drive the recipe with a `ScriptedEngine` on the real Qwen3 tokenizer, so
they need no model and no GPU; `tests/examples/test_examples.py` runs them all in CI.
"""
