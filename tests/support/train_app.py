"""`apps/train/__main__.py` loaded as a module, for tests that call its `main(argv)` in process."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

__all__ = ["load_train_app"]

APP = Path(__file__).resolve().parents[2] / "apps" / "train" / "__main__.py"


def load_train_app(module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, APP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
