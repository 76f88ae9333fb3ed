"""The OpenRLHF executor against a faithful stand-in for OpenRLHF's rollout engine: `LocalRolloutEngine` answers
OpenRLHF's `generate(prompt_token_ids, sampling_params, multi_modal_data=None)` with vLLM's real `RequestOutput`,
produced by the scripted engine (exact cases) or the `hf` engine on the tiny Qwen3 model. Sampling params are
vLLM's own, built the way OpenRLHF's `SamplesGenerator` builds them; the tokenizer is transformers', as
OpenRLHF passes it; the executor is loaded by OpenRLHF's own loader."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from vllm import SamplingParams as VLLMSamplingParams

from agent_protocol import HFTokenizer
from agent_runtime import (
    AgentRuntime,
    CompactionPolicy,
    EngineError,
    LLMEngine,
    SamplingParams,
    ScriptedEngine,
    read_trajectories,
)
from agent_runtime.serving import TrajectoryFiles
from agent_train import AGENT_FUNC_PATH, extra_log_keys
from agent_train.openrlhf.executor import AgentExecutor, as_tokenizer
from agent_train.openrlhf.segments import SEGMENTS_KEY
from agent_train.task import encode_task
from tests.agent_runtime.test_session import QUESTION, answer, call
from tests.agent_train.conftest import calculator_recipe
from tests.support.local_rollout_engine import LocalRolloutEngine

OPENRLHF_KEYS = {
    "prompt", "label", "images", "mm_train_inputs", "reward", "scores", "observation_tokens", "action_ranges",
    "rollout_log_probs", "truncated", "extra_logs",
}  # fmt: skip
TASK = encode_task({"prompt": QUESTION, "answer": "391"})


def openrlhf_params(*, logprobs: bool, temperature: float = 1.0) -> Any:
    """vLLM sampling params exactly as OpenRLHF's `SamplesGenerator._dispatch_prompts_to_vllm` makes them."""
    return VLLMSamplingParams(
        temperature=temperature,
        top_p=1.0,
        top_k=-1,
        max_tokens=None,
        min_tokens=1,
        skip_special_tokens=False,
        logprobs=1 if logprobs else None,
    )


class RecordingRolloutEngine(LocalRolloutEngine):
    """The stand-in, also keeping each request's `max_tokens` (what OpenRLHF's vLLM actor would be asked)."""

    def __init__(self, engine: LLMEngine) -> None:
        super().__init__(engine)
        self.max_tokens: list[int | None] = []

    async def generate(self, prompt_token_ids: Any, sampling_params: Any, multi_modal_data: Any = None) -> Any:
        self.max_tokens.append(sampling_params.max_tokens)
        return await super().generate(prompt_token_ids, sampling_params, multi_modal_data)


def execute(executor: AgentExecutor, engine: Any, hf_tokenizer: Any, *, max_length: int = 4096, **kw: Any) -> Any:
    params = openrlhf_params(logprobs=kw.pop("logprobs", True))
    prompt, label = kw.pop("prompt", TASK), kw.pop("label", "391")
    return asyncio.run(executor.execute(prompt, label, params, max_length, hf_tokenizer, engine, **kw))


def loss_mask(length: int, ranges: list[tuple[int, int]]) -> list[int]:
    mask = [0] * length
    for start, end in ranges:
        mask[start:end] = [1] * (end - start)
    return mask


def test_openrlhf_loads_the_stable_agent_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
    from openrlhf.utils.agent import AgentExecutorBase

    recipe_file = tmp_path / "calc_recipe.py"
    recipe_file.write_text("from tests.agent_train.conftest import calculator_recipe\nrecipe = calculator_recipe()\n")
    monkeypatch.setenv("AGENT_RECIPE", str(recipe_file))
    executor = _load_agent_executor(AGENT_FUNC_PATH)  # exactly what each OpenRLHF rollout actor does
    assert isinstance(executor, AgentExecutorBase)
    assert executor.recipe.name == "calc"

    monkeypatch.delenv("AGENT_RECIPE")
    with pytest.raises(ValueError, match="AGENT_RECIPE is not set"):
        _load_agent_executor(AGENT_FUNC_PATH)


def test_executor_and_runtime_give_the_same_tokens_masks_logprobs_and_reward(
    tokenizer: HFTokenizer, hf_tokenizer: Any
) -> None:
    script = [call("17 * 23"), answer("The answer is 391.")]
    recipe = calculator_recipe()
    direct_engine = ScriptedEngine(tokenizer, script, logprob=-0.25)
    runtime = AgentRuntime(direct_engine, recipe.make_session(), sampling=SamplingParams(max_new_tokens=64))
    direct = asyncio.run(runtime.run(QUESTION, task={"answer": "391"}))

    served = ScriptedEngine(tokenizer, script, logprob=-0.25)
    out = execute(AgentExecutor(recipe), LocalRolloutEngine(served), hf_tokenizer)

    (segment,) = direct.trajectory.segments
    assert set(out) == OPENRLHF_KEYS
    assert out["observation_tokens"] == segment.ids
    assert out["action_ranges"] == segment.action_ranges and len(segment.action_ranges) == 2
    assert loss_mask(len(out["observation_tokens"]), out["action_ranges"]) == segment.loss_mask
    assert out["rollout_log_probs"] == [-0.25 if m else 0.0 for m in segment.loss_mask]
    assert out["reward"] == out["scores"] == direct.reward == pytest.approx(1.1)  # matching 1 + a good tool call
    assert served.calls == direct_engine.calls  # the engine saw the same prompt ids at every turn
    assert out["prompt"] == TASK and out["label"] == "391" and out["truncated"] is False
    assert out["images"] is None and out["mm_train_inputs"] is None


def test_without_logprobs_requested_there_are_none(tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, [answer("391")], logprob=-1.0)
    out = execute(AgentExecutor(calculator_recipe()), LocalRolloutEngine(engine), hf_tokenizer, logprobs=False)
    assert out["rollout_log_probs"] is None
    assert out["reward"] == 1.0


def test_the_transformers_tokenizer_is_used_exactly(tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    text = (
        "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    ours = as_tokenizer(hf_tokenizer)
    assert ours.encode(text) == tokenizer.encode(text)
    assert ours.encode(text) == hf_tokenizer(text=text, add_special_tokens=False)["input_ids"]
    assert ours.token_to_id("<|im_end|>") == 151645
    assert ours.decode(tokenizer.encode(text)) == text


def test_plain_prompts_and_message_lists_work_too(tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    executor = AgentExecutor(calculator_recipe())
    for prompt in (QUESTION, [{"role": "user", "content": QUESTION}]):
        engine = ScriptedEngine(tokenizer, [call("17 * 23"), answer("391")])
        out = execute(executor, LocalRolloutEngine(engine), hf_tokenizer, prompt=prompt, label="391")
        assert out["reward"] == pytest.approx(1.1)
        assert out["prompt"] == prompt


def test_extra_logs_count_turns_tool_calls_and_error_codes(tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    broken_call = "<tool_call>\n{not json}\n</tool_call><|im_end|>"
    engine = ScriptedEngine(tokenizer, [broken_call, call("17 * 23"), answer("391")])
    recipe = calculator_recipe()
    out = execute(AgentExecutor(recipe), LocalRolloutEngine(engine), hf_tokenizer)
    logs = out["extra_logs"]
    assert list(logs) == extra_log_keys(recipe.rewards)
    assert all(isinstance(v, float) for v in logs.values())
    assert logs["agent_turns"] == 3 and logs["agent_generations"] == 3
    assert logs["agent_tool_calls"] == 2  # the broken call is a call too, answered with an error observation
    assert logs["agent_error_invalid_json"] == 1 and logs["agent_errors"] == 1
    assert logs["agent_final_answer"] == 1 and logs["agent_compactions"] == 0
    assert logs["agent_reward_matching"] == 1.0
    assert logs["agent_trained_tokens"] == sum(b - a for a, b in out["action_ranges"])
    assert logs["agent_untrained_tokens"] == 0


def test_a_failing_engine_ends_only_its_episode(tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    engine = ScriptedEngine(tokenizer, [call("17 * 23"), EngineError("vLLM died")])
    out = execute(AgentExecutor(calculator_recipe()), LocalRolloutEngine(engine), hf_tokenizer)
    assert out["extra_logs"]["agent_error_engine_error"] == 1
    assert len(out["action_ranges"]) == 1  # the turn that was generated is kept and trained
    assert out["extra_logs"]["agent_final_answer"] == 0


def test_max_length_bounds_every_turn_and_the_episode(tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    recipe = calculator_recipe(max_new_tokens=512)
    probe = ScriptedEngine(tokenizer, [call("17 * 23")])
    first = asyncio.run(AgentExecutor(recipe).rollout(QUESTION, "391", probe, max_length=4096))
    prompt_len = first.sample.action_ranges[0][0]
    after_call = len(first.sample.observation_tokens)  # prompt + call + tool result + next header
    max_length = after_call + 10

    long_call = call("1 + 1", reasoning="Let me think. " * 30)  # cut off by the length limit mid-reasoning
    engine = RecordingRolloutEngine(ScriptedEngine(tokenizer, [call("17 * 23"), long_call]))
    out = execute(AgentExecutor(recipe), engine, hf_tokenizer, max_length=max_length)
    # each turn is offered what is left of max_length, as OpenRLHF's own executor does
    assert engine.max_tokens == [max_length - prompt_len, max_length - after_call]
    assert len(out["observation_tokens"]) == max_length
    assert out["action_ranges"][-1] == (after_call, max_length)
    assert out["truncated"] is True  # the last turn hit the length limit
    assert out["extra_logs"]["agent_error_context_exhausted"] == 1  # no room for its feedback: a clean end

    too_long = execute(AgentExecutor(recipe), RecordingRolloutEngine(probe), hf_tokenizer, max_length=prompt_len)
    assert too_long["action_ranges"] == [] and too_long["extra_logs"]["agent_error_context_exhausted"] == 1


def test_compaction_returns_every_segment(tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    recipe = calculator_recipe(context=CompactionPolicy(compact_at_tokens=1))  # compact after the first tool turn
    summary = "I computed 17 * 23 = 391 with the calculator; left to do: answer.<|im_end|>"
    script = [call("17 * 23"), summary, answer("391")]
    rollout = asyncio.run(
        AgentExecutor(recipe).rollout(TASK, "391", ScriptedEngine(tokenizer, script, logprob=-0.5), with_logprobs=True)
    )
    first, last = rollout.trajectory.segments
    sample = rollout.sample
    assert sample.observation_tokens == last.ids
    assert sample.action_ranges == last.action_ranges == [(last.action_ranges[0][0], len(last.ids))]
    assert "Summary of your work" in tokenizer.decode(last.ids) and "<tool_response>" not in tokenizer.decode(last.ids)
    assert sample.extra_logs["agent_compactions"] == 1
    assert sample.extra_logs["agent_untrained_tokens"] == sum(first.loss_mask)  # the tool call and the summary
    assert sample.extra_logs["agent_trained_tokens"] == sum(last.loss_mask)
    assert sample.reward == pytest.approx(1.1)  # the episode's reward, earned across both segments

    assert rollout.segments == [*rollout.segments[:-1], sample] and len(rollout.segments) == 2
    assert rollout.segments[0].observation_tokens == first.ids  # the summary turn ends it, trained (loss mask 1)
    assert rollout.segments[0].action_ranges == first.action_ranges and len(first.action_ranges) == 2
    assert rollout.segments[0].reward == sample.reward  # the episode's reward on every segment

    # the same through OpenRLHF's entry point: the last segment as OpenRLHF's dict, the earlier ones under a key
    # that only the segment extension reads (OpenRLHF alone trains the last segment, as before)
    out = execute(AgentExecutor(recipe), LocalRolloutEngine(ScriptedEngine(tokenizer, script)), hf_tokenizer)
    assert set(out) == {*OPENRLHF_KEYS, SEGMENTS_KEY}
    assert out["observation_tokens"] == last.ids
    (earlier,) = out[SEGMENTS_KEY]
    assert set(earlier) == OPENRLHF_KEYS and earlier["observation_tokens"] == first.ids
    assert earlier["action_ranges"] == first.action_ranges and earlier["reward"] == out["reward"]


def test_the_trajectory_log_holds_each_episode_as_openrlhf_got_it(
    tokenizer: HFTokenizer, hf_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AGENT_TRAJECTORY_LOG``: each episode `execute` ran, appended as its `Trajectory`, whose segments are the
    records OpenRLHF's dict holds (a compacted one: every segment, the viewer marking its summary)."""
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

    recipe_file = tmp_path / "compacting_recipe.py"
    recipe_file.write_text(
        "from agent_runtime import CompactionPolicy\n"
        "from tests.agent_train.conftest import calculator_recipe\n"
        "recipe = calculator_recipe(context=CompactionPolicy(compact_at_tokens=1))\n"
    )
    log = tmp_path / "logs" / "rollouts.jsonl"
    monkeypatch.setenv("AGENT_RECIPE", str(recipe_file))
    monkeypatch.setenv("AGENT_TRAJECTORY_LOG", str(log))
    executor = _load_agent_executor(AGENT_FUNC_PATH)  # as each OpenRLHF rollout actor loads it
    summary = "I computed 17 * 23 = 391 with the calculator; left to do: answer."
    compacted = [call("17 * 23"), f"{summary}<|im_end|>", answer("391")]
    outs = [
        execute(executor, LocalRolloutEngine(ScriptedEngine(tokenizer, script, logprob=-0.5)), hf_tokenizer)
        for script in (compacted, [answer("391")])
    ]

    logged = list(read_trajectories(log))
    assert len(logged) == 2
    for trajectory, out in zip(logged, outs, strict=True):
        records = [*out.get(SEGMENTS_KEY, []), out]
        assert [s.ids for s in trajectory.segments] == [r["observation_tokens"] for r in records]
        assert [s.action_ranges for s in trajectory.segments] == [r["action_ranges"] for r in records]
        assert trajectory.reward == out["reward"]
    assert [len(t.segments) for t in logged] == [2, 1]
    files = TrajectoryFiles(log)
    view = files.record(files.page(limit=2)["items"][0].id)
    assert view["segments"][0]["summary_range"] == list(logged[0].segments[0].action_ranges[-1])
    assert view["segments"][1]["summary"] == summary

    monkeypatch.delenv("AGENT_TRAJECTORY_LOG")
    assert _load_agent_executor(AGENT_FUNC_PATH).trajectory_writer is None  # no log unless asked for


def test_hf_engine_rollout_is_what_the_model_generated(tiny_hf_engine: Any, hf_tokenizer: Any) -> None:
    recipe = calculator_recipe(max_new_tokens=12)
    engine = RecordingRolloutEngine(tiny_hf_engine)
    params = openrlhf_params(logprobs=True, temperature=0.0)
    executor = AgentExecutor(recipe)
    out = asyncio.run(executor.execute(TASK, "391", params, 4096, hf_tokenizer, engine))

    (start, end), *_ = out["action_ranges"]
    prompt = out["observation_tokens"][:start]
    direct = asyncio.run(tiny_hf_engine.generate(prompt, SamplingParams(max_new_tokens=12, temperature=0.0)))
    assert out["observation_tokens"][start:end] == direct.ids  # the model's ids, appended as generated
    assert out["rollout_log_probs"][start:end] == pytest.approx(direct.logprobs, abs=1e-4)
    assert set(out["rollout_log_probs"][:start]) == {0.0}
    assert engine.max_tokens[0] == 12
    assert out["extra_logs"]["agent_turns"] == len(out["action_ranges"]) >= 1


def test_images_are_refused(tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    engine = LocalRolloutEngine(ScriptedEngine(tokenizer, [answer("391")]))
    with pytest.raises(ValueError, match="text-only"):
        execute(AgentExecutor(calculator_recipe()), engine, hf_tokenizer, images=["cat.png"])


def test_openrlhf_turns_the_samples_into_one_training_batch(tokenizer: HFTokenizer, hf_tokenizer: Any) -> None:
    """OpenRLHF's own code consumes what `execute` returns: each dict becomes an `Experience`
    (`SamplesGenerator._process_response_into_experience`), and episodes that went very differently batch
    together, which needs the same `extra_logs` keys in every sample."""
    from openrlhf.trainer.ppo_utils.experience import make_experience_batch, split_experience_batch
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    scripts: list[list[Any]] = [
        [call("17 * 23"), answer("391")],  # tool, then the right answer
        ["<tool_call>\n{oops}\n</tool_call><|im_end|>", answer("390")],  # a broken call, then a wrong answer
        [EngineError("vLLM died")],  # nothing generated at all
        [answer("391")],  # answers without the tool
    ]
    executor = AgentExecutor(calculator_recipe())
    outs = [
        execute(executor, LocalRolloutEngine(ScriptedEngine(tokenizer, s, logprob=-1.0)), hf_tokenizer) for s in scripts
    ]
    experiences = [SamplesGenerator._process_response_into_experience(None, out, max_len=4096) for out in outs]

    for out, experience in zip(outs, experiences, strict=True):
        mask = loss_mask(len(out["observation_tokens"]), out["action_ranges"])
        assert experience.sequences[0].tolist() == out["observation_tokens"]
        assert experience.action_mask[0].tolist() == mask[1:]  # OpenRLHF shifts the mask onto targets
        assert experience.rollout_log_probs[0].tolist() == [-1.0 if m else 0.0 for m in mask[1:]]
    batch = make_experience_batch(experiences)
    assert [float(v) for v in batch.info["agent_turns"]] == [2.0, 2.0, 0.0, 1.0]
    assert [float(v) for v in batch.info["agent_error_engine_error"]] == [0.0, 0.0, 1.0, 0.0]
    assert [float(v) for v in batch.rewards] == pytest.approx([out["reward"] for out in outs])
    assert outs[0]["reward"] > outs[3]["reward"] > outs[2]["reward"] > outs[1]["reward"]  # the broken call costs
    assert len(split_experience_batch(batch)) == 4


def test_the_executor_adapts_a_tokenizer_once_across_calls(tiny_qwen3_dir: Any, hf_tokenizer: Any) -> None:
    """Ray hands each `generate_responses` call its own unpickled `hf_tokenizer`: the executor adapts the model's
    tokenizer once and every episode shares it (and its piece caches); another tokenizer gets its own."""
    import pickle

    from transformers import AutoTokenizer

    executor = AgentExecutor(calculator_recipe())
    first = executor.tokenizer_for(hf_tokenizer)
    assert executor.tokenizer_for(pickle.loads(pickle.dumps(hf_tokenizer))) is first
    assert executor.tokenizer_for(AutoTokenizer.from_pretrained(tiny_qwen3_dir)) is first
    assert first.encode("What is 17 * 23?") == hf_tokenizer("What is 17 * 23?", add_special_tokens=False)["input_ids"]
    other = pickle.loads(pickle.dumps(hf_tokenizer))
    other.add_tokens(["<extra_token_for_this_test>"])
    assert executor.tokenizer_for(other) is not first
