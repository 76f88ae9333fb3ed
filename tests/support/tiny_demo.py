"""An untrained demo model directory at test size: the demo's own tokenizer (trained on a few hundred episodes)
and a one-layer, width-32 Qwen3 with random weights, saved the way the trainer saves its checkpoints.

    path = save_tiny_demo_model(tmp_path)            # a loadable HF directory in about a second

Tests that need the real demo configuration build it themselves; this is for tests of the plumbing around a
model directory (loading, serving, evaluating, the cache), where what the model says does not matter."""

from __future__ import annotations

from pathlib import Path

from agent_train.demo.model import DemoModelSpec

__all__ = ["TINY_DEMO_SPEC", "save_tiny_demo_model"]

TINY_DEMO_SPEC = DemoModelSpec(
    hidden_size=32, num_hidden_layers=1, intermediate_size=64, num_attention_heads=2, head_dim=16
)


def save_tiny_demo_model(path: Path, *, tokenizer_episodes: int = 300, seed: int = 0) -> Path:
    """Train the demo tokenizer on `tokenizer_episodes` episodes, build the tiny model and save both at `path`."""
    from agent_demo.recipe import make_recipe
    from agent_demo.tokenizer import train_demo_tokenizer
    from agent_train.demo.model import build_demo_model, save_model_dir

    recipe = make_recipe()
    raw = train_demo_tokenizer(recipe.chat_protocol(), recipe.environment().tools, episodes=tokenizer_episodes)
    save_model_dir(build_demo_model(raw, TINY_DEMO_SPEC, seed=seed), raw, path)
    return path
