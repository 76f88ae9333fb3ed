"""Deprecated: ``python -m agent_train.openrlhf_main`` is now ``python -m agent_train.openrlhf.main``.

Kept because older commands and notes spell the old module; it runs the same `main` and warns.
"""

from __future__ import annotations

import warnings

from agent_train.openrlhf.main import RUNTIME_ENV_HOOK, TRAIN_MODULE, main

__all__ = ["RUNTIME_ENV_HOOK", "TRAIN_MODULE", "main"]

warnings.warn(
    "agent_train.openrlhf_main is deprecated: use `python -m agent_train.openrlhf.main`",
    DeprecationWarning,
    stacklevel=2,
)

if __name__ == "__main__":
    main()
