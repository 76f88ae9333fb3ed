"""The segment extension in real Ray workers, and what happens where it is missing.

A local Ray is started the way `agent_train.openrlhf.main` leaves the process before OpenRLHF's ``ray.init``:
``RAY_RUNTIME_ENV_HOOK`` set (and ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0``, which `scripts/check` and CI set for
``uv run``). A plain actor, an actor that actor creates (a nested one, as OpenRLHF's trainer creates its model
actors) and a plain task each report whether the extension is installed in their process.

Then a trainer process without the extension (taken out, as in a worker the hook never reached: a user running
``openrlhf.cli.train_ppo_ray`` with our executor directly): a compacted episode's record sent to it from another
actor stops with the extension's error (naming the fix), where OpenRLHF would otherwise train its last segment
only; a plain episode's record passes, and a trainer with the extension receives every segment.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("openrlhf")

from agent_train.openrlhf import main  # noqa: E402
from agent_train.openrlhf.segments import SEGMENTS_KEY, SegmentedRecord  # noqa: E402


@pytest.fixture(scope="module")
def hooked_ray() -> Iterator[None]:
    """A local Ray started as `agent_train.openrlhf.main` leaves things for OpenRLHF's ``ray.init``."""
    saved = {name: os.environ.get(name) for name in ("RAY_RUNTIME_ENV_HOOK", "RAY_ENABLE_UV_RUN_RUNTIME_ENV")}
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    os.environ["RAY_RUNTIME_ENV_HOOK"] = main.RUNTIME_ENV_HOOK
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def report() -> dict[str, Any]:
    from agent_train.openrlhf import segments

    return {"pid": os.getpid(), "installed": segments.installed()}


@ray.remote(num_cpus=0)
class Inner:
    def report(self) -> dict[str, Any]:
        return report()


@ray.remote(num_cpus=0)
class Outer:
    """A plain actor that creates a nested one, and answers episodes as our executor does in a rollout actor."""

    def report(self) -> dict[str, Any]:
        return report()

    def nested(self) -> dict[str, Any]:
        inner = Inner.remote()  # type: ignore[attr-defined]
        return ray.get(inner.report.remote())  # type: ignore[no-any-return]

    def episode(self, compacted: bool) -> dict[str, Any]:
        record: dict[str, Any] = {"observation_tokens": [1, 2, 3], "action_ranges": [[2, 3]], "reward": 1.0}
        if compacted:
            return SegmentedRecord(record, **{SEGMENTS_KEY: [dict(record)]})
        return record


@ray.remote(num_cpus=0)
class Trainer:
    """A process that has loaded OpenRLHF's sample generator, as OpenRLHF's trainer has; `take_out_the_extension`
    leaves it as a worker the hook never reached."""

    def __init__(self) -> None:
        import openrlhf.trainer.ppo_utils.samples_generator  # noqa: F401

    def take_out_the_extension(self) -> bool:
        from agent_train.openrlhf import segments

        segments.uninstall()
        return segments.installed()

    def receive(self, rollout: Any, compacted: bool) -> int:
        record = ray.get(rollout.episode.remote(compacted))
        return len(record.get(SEGMENTS_KEY) or [])


@pytest.fixture(scope="module")
def outer(hooked_ray: None) -> Any:
    return Outer.remote()  # type: ignore[attr-defined]


def test_plain_and_nested_actors_get_the_extension(outer: Any) -> None:
    reports = [ray.get(outer.report.remote(), timeout=600), ray.get(outer.nested.remote(), timeout=600)]
    assert len({r["pid"] for r in reports} | {os.getpid()}) == 3  # two worker processes besides this one
    assert [r["installed"] for r in reports] == [True, True]


def test_a_compacted_episode_stops_a_trainer_without_the_extension(outer: Any) -> None:
    trainer = Trainer.remote()  # type: ignore[attr-defined]
    assert ray.get(trainer.receive.remote(outer, True), timeout=600) == 1  # installed: every segment arrives
    assert ray.get(trainer.take_out_the_extension.remote(), timeout=600) is False
    assert ray.get(trainer.receive.remote(outer, False), timeout=600) == 0  # a plain episode needs no extension
    with pytest.raises(Exception, match="without agent-train's segment extension") as raised:
        ray.get(trainer.receive.remote(outer, True), timeout=600)
    assert "agent_train.openrlhf.main" in str(raised.value)
