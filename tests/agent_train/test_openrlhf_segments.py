"""The OpenRLHF segment extension, run through OpenRLHF 0.11.2's own code on CPU.

Episodes come from our executor's `execute` on replayed Qwen3 ids (a compacting calculator recipe): compacted
ones with 2 and 3 segments, plain ones, and one that runs out of steps without answering. OpenRLHF's
`SamplesGenerator._process_response_into_experience` and `_generate_vllm` turn them into `Experience`s,
`RemoteExperienceMaker.split_rollout_samples` batches them and `compute_advantages_and_returns` scores them; only
`make_experience` (the actor, reference and critic forward passes on GPUs) is a stand-in that gives zero KL and
zero values, as the preset tests do. The reference numbers are unpatched OpenRLHF's on the same episodes, one
sample per episode (what OpenRLHF trains without the extension).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
pytest.importorskip("openrlhf")

from agent_protocol import HFTokenizer  # noqa: E402
from agent_runtime import CompactionPolicy, ScriptedEngine  # noqa: E402
from agent_train.openrlhf import segments  # noqa: E402
from agent_train.openrlhf.executor import AgentExecutor  # noqa: E402
from agent_train.openrlhf.segments import OVERLONG_KEY, SEGMENTS_KEY  # noqa: E402
from tests.agent_runtime.test_session import answer, call  # noqa: E402
from tests.agent_train.conftest import calculator_recipe  # noqa: E402
from tests.agent_train.test_executor import OPENRLHF_KEYS, TASK, execute, openrlhf_params  # noqa: E402
from tests.agent_train.test_presets_openrlhf_advantages import (  # noqa: E402
    SAMPLES,
    _InProcessRay,
    openrlhf_module,
    preset_args,
)
from tests.support.local_rollout_engine import LocalRolloutEngine  # noqa: E402

SUMMARY = "I computed 17 * 23 = 391 with the calculator; left to do: answer.<|im_end|>"
COMPACT2 = [call("17 * 23"), SUMMARY, answer("391")]
COMPACT3 = [call("17 * 23"), SUMMARY, call("391 + 0"), SUMMARY, answer("391")]
COMPACT_WRONG = [call("17 * 23"), SUMMARY, answer("390")]
OVERLONG = [call("17 * 23"), SUMMARY, call("391 + 0"), SUMMARY, call("391 + 1"), call("391 + 2")]  # out of steps
RIGHT, WRONG = [answer("391")], [answer("390")]
GROUPS: list[list[list[str]]] = [
    [COMPACT2, WRONG, COMPACT3, RIGHT],
    [RIGHT, WRONG, WRONG, RIGHT],  # plain only
    [OVERLONG, COMPACT_WRONG, RIGHT, WRONG],
]
SEGMENTS = [[len([t for t in s if t == SUMMARY]) + 1 for s in group] for group in GROUPS]
ESTIMATORS = ["grpo", "dr_grpo", "rloo", "reinforce_baseline"]
MAX_LENGTH = 500  # compaction at 375: a short first turn stays under it, a long one crosses it


def compacting_recipe() -> Any:
    return calculator_recipe(context=CompactionPolicy(compact_at_tokens=1, max_compactions=2))


@pytest.fixture(scope="module")
def outputs(tokenizer: HFTokenizer, hf_tokenizer: Any) -> list[list[dict[str, Any]]]:
    executor = AgentExecutor(compacting_recipe())
    return [
        [
            execute(executor, LocalRolloutEngine(ScriptedEngine(tokenizer, script, logprob=-0.5)), hf_tokenizer)
            for script in group
        ]
        for group in GROUPS
    ]


@pytest.fixture
def installed() -> Iterator[None]:
    openrlhf_module("openrlhf.trainer.ppo_utils.experience_maker")  # imported once with flash-attn stand-ins
    segments.install()
    try:
        yield
    finally:
        segments.uninstall()


MAKE_BATCH = "openrlhf.trainer.ppo_utils.experience_maker:RemoteExperienceMaker.make_experience_batch"
TO_EXPERIENCE = "openrlhf.trainer.ppo_utils.samples_generator:SamplesGenerator._process_response_into_experience"


def episodes(outs: list[dict[str, Any]], *, unpatched: bool = False) -> list[Any]:
    """OpenRLHF's `Experience` of each episode (the extension's, when installed, unless `unpatched`), in order."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    convert = segments._resolve(TO_EXPERIENCE) if unpatched else SamplesGenerator._process_response_into_experience
    return [convert(None, out, max_len=4096) for out in outs]


def fake_forward(samples_list: list[Any]) -> list[Any]:
    """`make_experience` without the GPU models: zero KL (the reference is the policy), a zero critic."""
    for samples in samples_list:
        zeros = torch.zeros_like(samples.action_mask, dtype=torch.float32)
        samples.action_log_probs, samples.base_action_log_probs = zeros.clone(), None
        samples.kl, samples.values = zeros.clone(), zeros.clone()
        samples.info["kl"] = torch.zeros(len(samples.sequences))
    return samples_list


def maker_for(args: Any) -> Any:
    maker_module = openrlhf_module("openrlhf.trainer.ppo_utils.experience_maker")
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    maker = maker_module.RemoteExperienceMaker(
        None, None, None, None, FixedKLController(args.algo.kl.init_coef), SimpleNamespace(args=args),
        SimpleNamespace(pad_token_id=0),
    )  # fmt: skip
    maker.make_experience = fake_forward
    return maker


def per_sample(experiences: list[Any]) -> list[tuple[int, Any, Any, Any, Any]]:
    """(position in the flat list, ids, action mask, advantages, returns) of every sample, in flat order."""
    rows = []
    for experience in experiences:
        for row, position in enumerate(experience.index):
            length = int(experience.attention_mask[row].sum())
            mask = experience.action_mask[row][: length - 1].bool()
            rows.append(
                (
                    position,
                    experience.sequences[row][:length].tolist(),
                    mask,
                    experience.advantages[row][: length - 1],
                    experience.returns[row][: length - 1],
                )
            )
    return sorted(rows, key=lambda r: r[0])


def reference(outputs: list[list[dict[str, Any]]], algorithm: str) -> list[tuple[float, float]]:
    """Unpatched OpenRLHF: one sample per episode (its last segment); each episode's (advantage, return)."""
    maker = maker_for(preset_args(algorithm, micro_rollout_batch_size=3))
    batch = episodes([out for group in outputs for out in group], unpatched=True)
    scored = segments._resolve(MAKE_BATCH)(maker, batch)  # OpenRLHF's own method
    assert len(scored) == 4 and sum(len(e.index) for e in scored) == len(batch)
    result = []
    for _, _, mask, advantages, returns in per_sample(scored):
        assert torch.allclose(advantages[mask], advantages[mask][0].expand_as(advantages[mask]))
        result.append((float(advantages[mask][0]), float(returns[mask][0])))
    return result


def flat_owners() -> list[int]:
    counts = [count for group in SEGMENTS for count in group]
    return [episode for episode, count in enumerate(counts) for _ in range(count)]


def test_the_batch_is_as_scripted(outputs: list[list[dict[str, Any]]]) -> None:
    assert [[1 + len(out.get(SEGMENTS_KEY, [])) for out in group] for group in outputs] == SEGMENTS
    assert [[bool(out.get(OVERLONG_KEY)) for out in group] for group in outputs] == [
        [False] * 4, [False] * 4, [True, False, False, False],
    ]  # fmt: skip
    rewards = [[round(out["reward"], 3) for out in group] for group in outputs]
    assert rewards[0] == [1.1, 0.0, 1.2, 1.0]  # matching 1, plus 0.1 per good tool call
    assert all(len(set(r)) > 1 for r in rewards)  # every group has a signal
    plain = outputs[1][0]
    assert set(plain) == OPENRLHF_KEYS  # a plain episode's dict is OpenRLHF's, nothing added
    for out in (o for group in outputs for o in group):
        for segment in out.get(SEGMENTS_KEY, []):
            assert set(segment) == OPENRLHF_KEYS and segment["reward"] == out["reward"]


@pytest.mark.parametrize("algorithm", ESTIMATORS)
def test_every_segment_is_a_sample_with_its_episodes_advantage(
    outputs: list[list[dict[str, Any]]], installed: None, algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_MASK_OVERLONG", "0")
    expected = reference(outputs, algorithm)
    maker = maker_for(preset_args(algorithm, micro_rollout_batch_size=3))
    flat_outs = [out for group in outputs for out in group]
    batch = episodes(flat_outs)
    assert len(batch) == len(GROUPS) * SAMPLES  # one Experience per episode until training
    scored = maker.make_experience_batch(batch)
    assert maker.strategy.args.rollout.n_samples_per_prompt == SAMPLES  # restored

    owners = flat_owners()
    samples = per_sample(scored)
    assert len(samples) == len(owners) == sum(map(sum, SEGMENTS))  # one sample per segment
    segment_ids = [s["observation_tokens"] for out in flat_outs for s in [*out.get(SEGMENTS_KEY, []), out]]
    assert [ids for _, ids, _, _, _ in samples] == segment_ids  # the segments, in episode order

    returns = {}
    for (_, _, mask, advantages, ret), owner in zip(samples, owners, strict=True):
        assert mask.any()
        assert torch.allclose(ret[mask], torch.full_like(ret[mask], expected[owner][1]), atol=1e-6)
        returns.setdefault(owner, float(ret[mask][0]))
        if algorithm != "reinforce_baseline":  # no whitening: the advantage is the return
            assert torch.allclose(advantages[mask], torch.full_like(advantages[mask], expected[owner][0]), atol=1e-6)
    assert list(returns.values()) == pytest.approx([r for _, r in expected], abs=1e-6)

    if algorithm == "reinforce_baseline":  # whitened over every trained token of every segment
        tokens = torch.cat([advantages[mask] for _, _, mask, advantages, _ in samples])
        assert float(tokens.mean()) == pytest.approx(0.0, abs=1e-5)
        assert float(tokens.var(unbiased=False)) == pytest.approx(1.0, abs=1e-4)
        for _, _, mask, advantages, _ in samples:
            assert torch.allclose(advantages[mask], advantages[mask][0].expand_as(advantages[mask]), atol=1e-6)
    else:  # a plain episode's numbers are exactly unpatched OpenRLHF's
        counts = [count for group in SEGMENTS for count in group]
        for (_, _, mask, advantages, _), owner in zip(samples, owners, strict=True):
            if counts[owner] == 1:
                assert float(advantages[mask][0]) == expected[owner][0]
    for experience in scored:  # the episode's numbers are logged, once per sample
        assert {"reward", "group_reward_std", "return"} <= set(experience.info)


@pytest.mark.parametrize("algorithm", ESTIMATORS)
def test_a_batch_without_compaction_is_openrlhfs_own(
    outputs: list[list[dict[str, Any]]], installed: None, algorithm: str
) -> None:
    plain = [out for out in outputs[1]] * 2  # two prompts of plain episodes
    ours = maker_for(preset_args(algorithm)).make_experience_batch(episodes(plain))
    theirs = segments._resolve(MAKE_BATCH)(maker_for(preset_args(algorithm)), episodes(plain, unpatched=True))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        for name in ("sequences", "action_mask", "advantages", "returns", "rewards"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("algorithm", ["grpo", "reinforce_baseline"])
def test_an_overlong_episode_is_masked_but_counts_in_its_group(
    outputs: list[list[dict[str, Any]]], installed: None, algorithm: str
) -> None:
    expected = reference(outputs, algorithm)
    maker = maker_for(preset_args(algorithm, micro_rollout_batch_size=5))
    scored = maker.make_experience_batch(episodes([out for group in outputs for out in group]))
    owners = flat_owners()
    overlong = 2 * SAMPLES  # the first episode of the third group
    samples = per_sample(scored)
    masked = [s for s, owner in zip(samples, owners, strict=True) if owner == overlong]
    assert len(masked) == 3
    for _, _, mask, advantages, ret in masked:
        assert mask.any()  # its tokens keep their mask (and count in the loss's token count) ...
        assert torch.count_nonzero(advantages) == 0 and torch.count_nonzero(ret) == 0  # ... with no gradient
    others = [s for s, owner in zip(samples, owners, strict=True) if owner != overlong]
    for (_, _, mask, _, ret), owner in zip(others, [o for o in owners if o != overlong], strict=True):
        # the group's baseline still holds the over-long episode's reward: the same returns as unpatched OpenRLHF
        assert float(ret[mask][0]) == pytest.approx(expected[owner][1], abs=1e-6)
    if algorithm == "reinforce_baseline":  # the whitening statistics leave the masked tokens out
        tokens = torch.cat([advantages[mask] for _, _, mask, advantages, _ in others])
        assert float(tokens.mean()) == pytest.approx(0.0, abs=1e-5)
        assert float(tokens.var(unbiased=False)) == pytest.approx(1.0, abs=1e-4)


def test_generation_still_sees_one_sample_per_episode(
    outputs: list[list[dict[str, Any]]], installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenRLHF's `_generate_vllm` (DAPO's dynamic filtering on) with the patched response conversion: groups are
    filtered on their episodes' scores, and each accepted episode carries its segments."""
    from openrlhf.trainer.ppo_utils import samples_generator

    args = preset_args("dapo")
    monkeypatch.setattr(samples_generator, "ray", _InProcessRay)
    generator = samples_generator.SamplesGenerator.__new__(samples_generator.SamplesGenerator)
    generator.args = args
    generator._dispatch_prompts_to_vllm = lambda prompts, labels, **kw: [outputs[int(p)] for p in prompts]
    loader = iter([(None, [str(i)], ["391"], [None]) for i in range(len(outputs))])
    accepted, consumed, _ = generator._generate_vllm(loader, 3, True, max_len=4096)
    assert consumed == 3 and len(accepted) == 3 * SAMPLES
    assert [1 + len(getattr(e, "agent_segments", [])) for e in accepted] == [c for g in SEGMENTS for c in g]
    assert [bool(getattr(e, "agent_overlong", False)) for e in accepted].count(True) == 1


def test_the_pinned_internals_are_openrlhf_0_11_2s(installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    segments.check_pins()
    for target, digest in segments.PINNED.items():
        assert segments.source_digest(target) == digest, target
    from openrlhf.models.utils import compute_reward
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    original = segments._ORIGINAL
    assert list(inspect.signature(compute_reward).parameters) == [
        "r", "kl_coef", "kl", "action_mask", "reward_clip_range",
    ]  # fmt: skip
    assert list(inspect.signature(RemoteExperienceMaker.compute_advantages_and_returns).parameters) == [
        "self", "experiences",
    ]  # fmt: skip
    make = original["openrlhf.trainer.ppo_utils.experience_maker:RemoteExperienceMaker.make_experience_batch"]
    assert list(inspect.signature(make).parameters) == ["self", "rollout_samples"]

    monkeypatch.setattr(segments, "installed_version", lambda name: "0.11.3")
    with pytest.raises(segments.SegmentExtensionError, match=r"pinned to OpenRLHF 0\.11\.2, found 0\.11\.3"):
        segments.check_pins()


def test_the_ray_hooks_install_it_in_every_worker() -> None:
    env = segments.runtime_env_hook({"env_vars": {"A": "1"}})
    assert env == {"env_vars": {"A": "1"}, "worker_process_setup_hook": "agent_train.openrlhf.segments.setup_worker"}
    assert segments.runtime_env_hook(None)["worker_process_setup_hook"] == segments.SETUP_HOOK


def test_the_entry_module_installs_then_runs_openrlhfs_main(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_train.openrlhf import main

    calls: list[Any] = []
    monkeypatch.delenv("RAY_RUNTIME_ENV_HOOK", raising=False)
    monkeypatch.setattr(main, "install", lambda: calls.append("install"))
    monkeypatch.setattr(main.runpy, "run_module", lambda name, **kw: calls.append((name, kw)))
    main.main()
    assert calls == ["install", ("openrlhf.cli.train_ppo_ray", {"run_name": "__main__", "alter_sys": True})]
    import os

    assert os.environ["RAY_RUNTIME_ENV_HOOK"] == "agent_train.openrlhf.segments.runtime_env_hook"


class LengthsPolicy:
    """A policy for ScriptedEngine: the n-th sample's first turn is a tool call with `reasonings[n]`; then it
    summarizes when asked and answers."""

    def __init__(self, tokenizer: HFTokenizer, reasonings: list[str]) -> None:
        self.tokenizer = tokenizer
        self.reasonings = iter(reasonings)

    def __call__(self, prompt: Any) -> str:
        text = self.tokenizer.decode(prompt)
        if "Summary of your work" in text:
            return answer("391")
        if "Reply with the summary only" in text:
            return SUMMARY
        if "<tool_response>" in text:
            return answer("391")
        return call("17 * 23", reasoning=next(self.reasonings))


class ActorStandIn(LocalRolloutEngine):
    """What OpenRLHF's `generate_responses` needs of `self`: the executor, and `generate`."""

    def __init__(self, engine: ScriptedEngine, executor: AgentExecutor) -> None:
        super().__init__(engine)
        self.executor = executor


def test_every_sample_of_a_group_compacts_at_the_same_threshold(
    tokenizer: HFTokenizer, hf_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenRLHF's `generate_responses` runs a prompt's samples with one `max_length` (`--data.max_len`); each
    session caps its context at it, so the compaction threshold (`compact_at_tokens`, else 3/4 of the context) is
    the same for every sample of the group, however long its turns are."""
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    seen: list[int | None] = []
    real = CompactionPolicy.wants_summary

    def spy(self: CompactionPolicy, **kw: Any) -> bool:
        seen.append(self.threshold(kw["max_context_tokens"]))
        return real(self, **kw)

    monkeypatch.setattr(CompactionPolicy, "wants_summary", spy)
    max_length = MAX_LENGTH
    reasonings = ["I should use the calculator.", "Let me think this through. " * 12, "Short."]
    engine = ScriptedEngine(tokenizer, policy=LengthsPolicy(tokenizer, reasonings))
    actor = ActorStandIn(engine, AgentExecutor(calculator_recipe(context=CompactionPolicy(max_compactions=1))))
    generate_responses = RolloutRayActor.__ray_metadata__.modified_class.generate_responses  # OpenRLHF's code
    outs = asyncio.run(
        generate_responses(actor, TASK, "391", openrlhf_params(logprobs=False), max_length, hf_tokenizer, 3)
    )
    assert len(seen) == 3 and set(seen) == {max_length * 3 // 4}  # one threshold for every sample's feedback
    assert [out["extra_logs"]["agent_compactions"] for out in outs] == [0, 1, 0]  # only the long turn crossed it
    assert all(out["extra_logs"]["agent_final_answer"] == 1 for out in outs)
