"""The old spellings a README or a note may still show keep working, with a `DeprecationWarning` that names the new
one: ``python -m agent_train.openrlhf_main`` (now `agent_train.openrlhf.main`) and `agent_train.LocalRolloutEngine`
(a test fake, now in tests/support)."""

from __future__ import annotations

import importlib
import sys

import pytest

import agent_train
from agent_train.openrlhf import main as openrlhf_main
from tests.support.local_rollout_engine import LocalRolloutEngine


def test_the_old_entry_module_runs_the_new_main_and_says_so() -> None:
    sys.modules.pop("agent_train.openrlhf_main", None)
    with pytest.warns(DeprecationWarning, match=r"python -m agent_train\.openrlhf\.main"):
        old = importlib.import_module("agent_train.openrlhf_main")
    assert old.main is openrlhf_main.main and old.RUNTIME_ENV_HOOK == openrlhf_main.RUNTIME_ENV_HOOK


def test_the_package_still_hands_out_the_test_rollout_engine_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"tests\.support\.local_rollout_engine"):
        assert agent_train.LocalRolloutEngine is LocalRolloutEngine
    assert "LocalRolloutEngine" not in agent_train.__all__
