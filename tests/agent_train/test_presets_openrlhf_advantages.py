"""What each `--algo` preset's estimator needs from a batch, checked with OpenRLHF's own code on samples our
executor produced (the recipe's session, replayed token ids, OpenRLHF's `execute` contract):

- advantages: OpenRLHF's `RemoteExperienceMaker.compute_advantages_and_returns` (trainer/ppo_utils/
  experience_maker.py), with the preset's arguments as OpenRLHF's parser leaves them, over `Experience`s made by
  OpenRLHF's `SamplesGenerator._process_response_into_experience`; the group presets need every prompt's
  `n_samples_per_prompt` samples back, consecutive, and the local trainer's estimator of the same name gives the
  same advantage on every action token;
- DAPO's dynamic filtering: OpenRLHF's `SamplesGenerator._generate_vllm` reads ``scores`` (our executor returns
  the episode's reward there), drops the prompt whose samples all scored the same and dispatches a new one;
- IS correction: the executor returns rollout logprobs aligned with the actions, and OpenRLHF's `PolicyLoss`
  with the preset's correction keeps every token when they are the policy's own logprobs and masks every token
  when they are not.

The critic (``ppo``) is a zero value function and the KL to the reference is zero (the reference is the policy at
step 0); Ray's transport in `_generate_vllm` is an in-process stand-in. Everything else is OpenRLHF's."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
pytest.importorskip("openrlhf")

from agent_env import CalculatorTool, FunctionCallEnvironment, MatchingReward, RewardPipeline  # noqa: E402
from agent_protocol import HFTokenizer  # noqa: E402
from agent_runtime import ScriptedEngine  # noqa: E402
from agent_runtime.recipe import Recipe, load_recipe  # noqa: E402
from agent_train import LaunchConfig, check_plan, plan_launch  # noqa: E402
from agent_train.local.batch import pad_batch, token_logprobs  # noqa: E402
from agent_train.local.rl import group_advantages  # noqa: E402
from agent_train.openrlhf.executor import AgentExecutor  # noqa: E402
from agent_train.openrlhf.optional_flash_attn import load_ring_attn_utils  # noqa: E402
from tests.agent_runtime.test_session import answer, call  # noqa: E402
from tests.agent_train.test_executor import execute  # noqa: E402
from tests.support.local_rollout_engine import LocalRolloutEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = 4
RIGHT, WRONG = [answer("391")], [answer("390")]
TOOL_RIGHT, TOOL_WRONG = [call("17 * 23"), answer("391")], [call("17 * 23"), answer("392")]
GROUPS: list[list[list[Any]]] = [
    [TOOL_RIGHT, WRONG, RIGHT, TOOL_WRONG],  # 1 0 1 0, of different lengths
    [RIGHT, TOOL_RIGHT, RIGHT, RIGHT],  # all right: no signal, DAPO drops it
    [RIGHT, WRONG, TOOL_WRONG, WRONG],  # 1 0 0 0
]
LOCAL = {  # the local trainer's estimator computing the preset's advantage (ppo: with a zero critic, GAE is this)
    "ppo": "reinforce", "reinforce": "reinforce", "reinforce_baseline": "reinforce_baseline", "rloo": "rloo",
    "grpo": "grpo", "dr_grpo": "dr_grpo", "dapo": "grpo",
}  # fmt: skip
GROUP_PRESETS = {"reinforce_baseline", "rloo", "grpo", "dr_grpo", "dapo"}


def openrlhf_module(name: str) -> ModuleType:
    """An OpenRLHF module that imports `openrlhf.models`, whose ring-attention helpers import flash-attn at module
    level: a CUDA-only wheel the workspace excludes and that the advantage and loss code never calls. The job's own
    loader (`optional_flash_attn.load_ring_attn_utils`) loads that module with stand-ins that raise when called."""
    load_ring_attn_utils()
    return importlib.import_module(name)


def recipe01() -> Recipe:
    """The calculator task scored 0 or 1 (right answer or not): DAPO's default filtering range (0, 1) fits it."""
    return Recipe(
        name="calc01",
        protocol="qwen3",
        environment=lambda: FunctionCallEnvironment(tools=[CalculatorTool()], max_steps=4),
        rewards=RewardPipeline(result=[MatchingReward()]),
        max_new_tokens=64,
    )


@pytest.fixture(scope="module")
def outputs(tokenizer: HFTokenizer, hf_tokenizer: Any) -> list[list[dict[str, Any]]]:
    """The executor's `execute` results: SAMPLES per prompt, one prompt per group of scripts."""
    executor = AgentExecutor(recipe01())
    return [
        [execute(executor, LocalRolloutEngine(ScriptedEngine(tokenizer, script)), hf_tokenizer) for script in group]
        for group in GROUPS
    ]


def preset_args(algorithm: str, **changes: Any) -> Any:
    config = LaunchConfig(
        recipe=str(ROOT / "recipes" / "calculator.py"),
        pretrain="m",
        algorithm=algorithm,  # type: ignore[arg-type]
        samples_per_prompt=SAMPLES,
        run_dir="/nonexistent/run",
        **changes,
    )
    return check_plan(plan_launch(config, load_recipe(config.recipe))).args


def experiences(outs: list[dict[str, Any]]) -> list[Any]:
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    return [SamplesGenerator._process_response_into_experience(None, out, max_len=4096) for out in outs]


def test_the_batch_scores_as_scripted(outputs: list[list[dict[str, Any]]]) -> None:
    assert [[out["reward"] for out in group] for group in outputs] == [[1, 0, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert all(out["scores"] == out["reward"] for group in outputs for out in group)


@pytest.mark.parametrize("algorithm", list(LOCAL))
def test_openrlhfs_advantages_of_each_preset_over_executor_samples(
    outputs: list[list[dict[str, Any]]], algorithm: str
) -> None:
    maker_module = openrlhf_module("openrlhf.trainer.ppo_utils.experience_maker")
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    args = preset_args(algorithm)
    flat = [out for group in outputs for out in group]  # OpenRLHF's order: a prompt's samples are consecutive
    batch = experiences(flat)
    for index, experience in enumerate(batch):  # as RemoteExperienceMaker.make_experience leaves them
        experience.index = [index]
        experience.kl = torch.zeros_like(experience.action_mask, dtype=torch.float32)
        experience.values = torch.zeros_like(experience.action_mask, dtype=torch.float32)  # a critic knowing nothing
    maker = maker_module.RemoteExperienceMaker(
        None, None, None, None, FixedKLController(args.algo.kl.init_coef), SimpleNamespace(args=args), None
    )
    batch = maker.compute_advantages_and_returns(batch)

    per_sample = []
    for experience in batch:
        mask = experience.action_mask[0].bool()
        values = experience.advantages[0][mask]
        assert mask.any() and torch.isfinite(values).all()
        assert torch.allclose(values, values[0].expand_as(values), atol=1e-6)  # one advantage per episode
        per_sample.append(float(values[0]))
    local = group_advantages(
        [float(out["reward"]) for out in flat],
        [group for group, outs in enumerate(outputs) for _ in outs],
        LOCAL[algorithm],  # type: ignore[arg-type]
        token_counts=[int(e.action_mask.sum()) for e in batch],
    )
    assert per_sample == pytest.approx(local, rel=1e-5, abs=1e-6)
    all_right = per_sample[SAMPLES : 2 * SAMPLES]
    if algorithm in GROUP_PRESETS:  # the all-right group: one advantage for all, zero unless whitened afterwards
        assert all_right == pytest.approx([all_right[0]] * SAMPLES, abs=1e-6)
        assert (all_right[0] == pytest.approx(0.0, abs=1e-6)) == (algorithm != "reinforce_baseline")
    else:  # no group baseline: a right answer scores above the batch's mean
        assert min(all_right) > 0.1


class _InProcessRay:
    """What `_generate_vllm` asks of Ray: wait for one ready reference, get its value (here, the value itself)."""

    @staticmethod
    def wait(refs: list[Any], num_returns: int = 1, timeout: float | None = None) -> tuple[list[Any], list[Any]]:
        return refs[:num_returns], refs[num_returns:]

    @staticmethod
    def get(ref: Any) -> Any:
        return ref


def test_dapo_dynamic_filtering_drops_the_all_equal_group_and_refills(
    outputs: list[list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from openrlhf.trainer.ppo_utils import samples_generator

    args = preset_args("dapo")
    assert args.algo.dynamic_filtering_enable and tuple(args.algo.dynamic_filtering_range) == (0.0, 1.0)
    monkeypatch.setattr(samples_generator, "ray", _InProcessRay)
    dispatched: list[str] = []

    def dispatch(prompts: list[str], labels: list[str], **kwargs: Any) -> list[list[dict[str, Any]]]:
        dispatched.extend(prompts)
        return [outputs[int(prompt)] for prompt in prompts]  # one reference per prompt: its samples' responses

    generator = SimpleNamespace(
        args=args,
        _dispatch_prompts_to_vllm=dispatch,
        _process_response_into_experience=lambda response, **kw: (
            samples_generator.SamplesGenerator._process_response_into_experience(None, response, **kw)
        ),
    )
    loader = iter([(None, [str(i)], ["391"], [None]) for i in range(len(outputs))])
    accepted, consumed, exhausted = samples_generator.SamplesGenerator._generate_vllm(
        generator, loader, 2, True, max_len=4096
    )
    assert dispatched == ["0", "1", "2"]  # prompt 1 scored 1 1 1 1: filtered, and prompt 2 sent in its place
    assert consumed == 3 and not exhausted
    assert [float(e.scores[0]) for e in accepted] == [1, 0, 1, 0, 1, 0, 0, 0]


def test_is_correction_reads_the_executors_rollout_logprobs(tiny_hf_engine: Any, hf_tokenizer: Any) -> None:
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    loss_module = openrlhf_module("openrlhf.models.loss")
    args = preset_args("grpo", is_correction=True)
    correction = args.algo.advantage
    executor = AgentExecutor(recipe01())
    engine = LocalRolloutEngine(tiny_hf_engine)
    out = execute(executor, engine, hf_tokenizer, logprobs=True)  # OpenRLHF asks vLLM for logprobs=1 here
    assert out["rollout_log_probs"] is not None and len(out["rollout_log_probs"]) == len(out["observation_tokens"])
    experience = SamplesGenerator._process_response_into_experience(None, out, max_len=4096)
    mask = experience.action_mask.float()

    ids = out["observation_tokens"]
    batch = pad_batch([ids], [[0] * len(ids)], pad_id=0)
    with torch.no_grad():
        policy = token_logprobs(tiny_hf_engine.model, batch)  # the trainer's logprobs of the same tokens
    assert policy.shape == experience.rollout_log_probs.shape == mask.shape
    loss = loss_module.PolicyLoss(
        is_correction_level=correction.is_correction_level,
        is_correction_mode=correction.is_correction_mode,
        is_correction_threshold=correction.is_correction_threshold,
    )
    advantages = torch.ones_like(policy)
    rollout = experience.rollout_log_probs.float()
    _, _, _, vllm_kl, filtered = loss(policy, policy, advantages, mask, rollout_log_probs=rollout)
    assert float(filtered) == 0.0 and abs(float(vllm_kl)) < 1e-3  # the engine's logprobs are the policy's
    _, _, _, _, filtered = loss(policy, policy, advantages, mask, rollout_log_probs=rollout - 3.0)
    assert float(filtered) == pytest.approx(1.0)  # ratio e^3 > 5: every action token is masked
