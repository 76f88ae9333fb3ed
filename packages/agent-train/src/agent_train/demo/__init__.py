"""The demo model: its shape (`model`: `DemoModelSpec`, `build_demo_model`, `save_model_dir`; imports torch, not
imported here) and the cache where the trained model lives (`build`: `find_demo_model`, `ensure_demo_model`, which
`apps/serve` calls when no model is named, `install_demo_model`, `demo_home`).

The demo *agent* (task, recipe, tokenizer spec, scripted expert, chat template) is the agent-demo package
(`agent_demo`), below this layer: serving the demo needs nothing from agent-train. Importing this package does
not import torch.
"""

from agent_train.demo.build import (
    DEMO_BUILD,
    demo_home,
    demo_model_dir,
    ensure_demo_model,
    find_demo_model,
    install_demo_model,
)

__all__ = [
    "DEMO_BUILD",
    "demo_home",
    "demo_model_dir",
    "ensure_demo_model",
    "find_demo_model",
    "install_demo_model",
]
