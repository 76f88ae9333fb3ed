"""The executor's VLM output against OpenRLHF 0.11.2's own `MultiTurnAgentExecutor` on the same scripted episode.

OpenRLHF's side is its real executor with an `AgentInstanceBase` that replays the episode as text: `reset` gives the
prompt rendered by the official Qwen3-VL template (from the row as OpenRLHF's prompt dataset turns it into messages,
`_str_to_content_list`), `step` gives each tool result as the official template continues the conversation, with its
images as `environment_images`. Ours is `AgentExecutor` on a qwen3-vl recipe whose environment returns the same
images from its tool. Both get the same processor (a Qwen2-VL processor assembled offline from transformers'
`Qwen2VLImageProcessor` and the Qwen3 tokenizer, as OpenRLHF passes a VLM's processor for `hf_tokenizer`) and an
honest stand-in for OpenRLHF's vLLM actor that replays real token ids, collapses pads as the actor does and refuses
a prompt whose placeholders are not one per image, as vLLM would. Everything OpenRLHF trains on must be equal: the
tokens, the action ranges, the logprobs, the images, the processor's tensors (`torch.equal`), and what each engine
call was given (ids and the pixels of `multi_modal_data`)."""

from __future__ import annotations

import asyncio
import random
import uuid
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
transformers = pytest.importorskip("transformers")

import numpy as np  # noqa: E402
from openrlhf.datasets.prompts_dataset import _str_to_content_list  # noqa: E402
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor  # noqa: E402
from openrlhf.utils.vlm_utils import dedup_media_tokens  # noqa: E402
from vllm import SamplingParams as VLLMSamplingParams  # noqa: E402
from vllm.logprobs import Logprob  # noqa: E402
from vllm.outputs import CompletionOutput, RequestOutput  # noqa: E402

from agent_env import Environment, MatchingReward, Observation, RewardPipeline, StepResult  # noqa: E402
from agent_protocol import Action  # noqa: E402
from agent_protocol.images import VisionGrid  # noqa: E402
from agent_protocol.tokenizer import processor_vision_grid  # noqa: E402
from agent_runtime import CompactionPolicy, Recipe  # noqa: E402
from agent_train.errors import LaunchError  # noqa: E402
from agent_train.openrlhf.executor import AgentExecutor, as_tokenizer  # noqa: E402
from agent_train.openrlhf.launcher import LaunchConfig, check_plan, image_flags, plan_launch  # noqa: E402
from agent_train.openrlhf.segments import SEGMENTS_KEY  # noqa: E402
from agent_train.task import dataset_images, decode_task, encode_task, place_images  # noqa: E402
from tests.agent_protocol.families.test_qwen3_vl import data_url, official  # noqa: E402

PAD = 151655
GRID = VisionGrid(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)  # few pads per image: a fast test
MAX_LENGTH = 4096
ANSWER = "It is grey.<|im_end|>"


@pytest.fixture(scope="module")
def processor(qwen3_tokenizer_file: Path) -> Any:
    return transformers.Qwen2VLProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(
            size={"shortest_edge": GRID.min_pixels, "longest_edge": GRID.max_pixels}
        ),
        tokenizer=transformers.PreTrainedTokenizerFast(tokenizer_file=str(qwen3_tokenizer_file)),
        video_processor=transformers.Qwen2VLVideoProcessor(),
    )


def vllm_params() -> Any:
    """vLLM sampling params as OpenRLHF's `SamplesGenerator` makes them, logprobs on (a fresh object per run: OpenRLHF's
    executor assigns `max_tokens` on the one it is given)."""
    return VLLMSamplingParams(
        temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1, skip_special_tokens=False, logprobs=1
    )


class ReplayActor:
    """OpenRLHF's vLLM rollout actor as the executors call it, `generate(prompt_token_ids, sampling_params,
    multi_modal_data=None)`, replaying `actions` (real token ids) in order. Like the actor it collapses each run of
    pads before "vLLM" sees the prompt (`dedup_media_tokens`), and like vLLM it refuses placeholders that are not
    one per image. Each token's logprob is a function of the token. Every call is recorded as given."""

    def __init__(self, tokenizer: Any, actions: list[str]) -> None:
        self.tokenizer = tokenizer
        self.actions = [tokenizer.encode(text, add_special_tokens=False) for text in actions]
        self.calls: list[tuple[list[int], Any]] = []

    async def generate(self, prompt_token_ids: Any, sampling_params: Any, multi_modal_data: Any = None) -> Any:
        ids = [int(i) for i in prompt_token_ids]
        seen = dedup_media_tokens(ids, {PAD}) if multi_modal_data else ids
        images = len(multi_modal_data["image"]) if multi_modal_data else 0
        if seen.count(PAD) != images:
            raise ValueError(f"the prompt holds {seen.count(PAD)} image placeholders for {images} images")
        # what the call was given, as it was then (OpenRLHF's executor keeps extending the list it passed)
        self.calls.append((ids, {"image": list(multi_modal_data["image"])} if multi_modal_data else None))
        tokens = self.actions[len(self.calls) - 1]
        assert sampling_params.max_tokens is None or len(tokens) <= sampling_params.max_tokens
        logprobs = [{t: Logprob(logprob=-(t % 89) / 64 - 0.01, rank=1, decoded_token=None)} for t in tokens]
        completion = CompletionOutput(
            index=0,
            text=self.tokenizer.decode(tokens, skip_special_tokens=False),
            token_ids=list(tokens),
            cumulative_logprob=None,
            logprobs=logprobs if sampling_params.logprobs is not None else None,
            finish_reason="stop",
            stop_reason=None,
        )
        return RequestOutput(
            request_id=uuid.uuid4().hex,
            prompt=None,
            prompt_token_ids=ids,
            prompt_logprobs=None,
            outputs=[completion],
            finished=True,
        )


class ZoomEnvironment(Environment):
    """Answers every tool call with "zoomed" and the images scripted for that turn; a turn without calls answers."""

    def __init__(self, images_per_turn: list[list[str]]) -> None:
        super().__init__(max_steps=8)
        self.images_per_turn = images_per_turn

    async def transition(self, action: Action) -> StepResult:
        if not action.tool_calls:
            return StepResult(done=True, final_answer=action.content.strip(), stop_reason="final_answer")
        urls = tuple(self.images_per_turn[self.step_count - 1])
        observations = tuple(
            Observation(tool_call_id=call.id, name=call.name, content="zoomed", images=urls)
            for call in action.tool_calls
        )
        return StepResult(observations=observations)


def vision_recipe(images_per_turn: list[list[str]], **kwargs: Any) -> Recipe:
    options: dict[str, Any] = {"max_new_tokens": 256, "max_images": 8, **kwargs}
    return Recipe(
        name="look",
        protocol="qwen3-vl",
        environment=lambda: ZoomEnvironment(images_per_turn),
        rewards=RewardPipeline(result=[MatchingReward()]),
        **options,
    )


def zoom(k: int) -> str:
    return f'<tool_call>\n{{"name": "zoom", "arguments": {{"box": [0, {k}, 8, 8]}}}}\n</tool_call><|im_end|>'


def zoom_message(k: int) -> dict[str, Any]:
    call = {"type": "function", "function": {"name": "zoom", "arguments": {"box": [0, k, 8, 8]}}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


class Episode:
    """One scripted episode: the row (`question` with or without ``<image>`` tags, `images`), the images each zoom
    returns, the actions, and OpenRLHF's side of it as text from the official template."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)

        def image() -> str:
            return data_url(rng.randint(1, 400), rng.randint(1, 400))

        self.images = [image() for _ in range(1 + seed % 2)]
        self.tool_images = [[image() for _ in range(1 + (seed + k) % 2)] for k in range(2)]
        tags = ["", "<image>" * len(self.images), " <image> ".join(["Look"] * (len(self.images) + 1))][seed % 3]
        self.question = f"{tags}What colour is it?"
        self.actions = [zoom(0), zoom(1), ANSWER]

        # OpenRLHF's side: the row as its prompt dataset renders it (images first where the text has no tags)
        content = _str_to_content_list(self.question)
        if isinstance(content, str):
            content = [{"type": "image"} for _ in self.images] + [{"type": "text", "text": content}]
        messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
        self.prompt_text = official(messages, None, True)
        text = self.prompt_text
        self.feedback: list[tuple[str, list[str]]] = []
        for k, urls in enumerate(self.tool_images):
            messages.append(zoom_message(k))
            before = official(messages, None, False).removesuffix("\n")
            assert before == text + self.actions[k]  # the action is the template's own render of the turn
            tool = [{"type": "image"} for _ in urls] + [{"type": "text", "text": "zoomed"}]
            messages.append({"role": "tool", "content": tool})
            after = official(messages, None, True)
            self.feedback.append((after[len(before) :], urls))
            text = after
        self.feedback.append(("", []))

    def agent(self) -> type[AgentInstanceBase]:
        """An OpenRLHF agent instance class that replays this episode's text (and checks the actions it is given)."""
        episode = self

        class ScriptedAgent(AgentInstanceBase):
            def __init__(self) -> None:
                self.turn = 0

            async def reset(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
                return {"observation": episode.prompt_text}

            async def step(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
                assert states["action_text"] == episode.actions[self.turn]
                text, urls = episode.feedback[self.turn]
                self.turn += 1
                done = self.turn == len(episode.feedback)
                return {
                    "rewards": torch.tensor(1.0 if done else 0.0),
                    "environment_feedback": text,
                    "environment_images": urls or None,
                    "done": done,
                }

        return ScriptedAgent


def run_both(episode: Episode, processor: Any, **recipe_options: Any) -> tuple[Any, Any, ReplayActor, ReplayActor]:
    theirs_actor = ReplayActor(processor.tokenizer, episode.actions)
    theirs = asyncio.run(
        MultiTurnAgentExecutor(episode.agent()).execute(
            episode.question, "grey", vllm_params(), MAX_LENGTH, processor, theirs_actor, images=list(episode.images)
        )
    )
    ours_actor = ReplayActor(processor.tokenizer, episode.actions)
    executor = AgentExecutor(vision_recipe(episode.tool_images, **recipe_options))
    ours = asyncio.run(
        executor.execute(
            episode.question, "grey", vllm_params(), MAX_LENGTH, processor, ours_actor, images=list(episode.images)
        )
    )
    return theirs, ours, theirs_actor, ours_actor


def pixels(image: Any) -> tuple[Any, str, bytes]:
    return image.size, image.mode, np.asarray(image).tobytes()


@pytest.mark.parametrize("seed", range(6))
def test_the_executor_returns_what_openrlhfs_multi_turn_executor_returns(seed: int, processor: Any) -> None:
    episode = Episode(seed)
    theirs, ours, theirs_actor, ours_actor = run_both(episode, processor)

    assert ours["observation_tokens"] == theirs["observation_tokens"]
    assert ours["action_ranges"] == [tuple(r) for r in theirs["action_ranges"]]
    assert ours["rollout_log_probs"] == theirs["rollout_log_probs"]
    assert ours["images"] == theirs["images"] == episode.images
    assert ours["truncated"] == theirs["truncated"] is False
    assert ours["prompt"] == theirs["prompt"] and ours["label"] == theirs["label"]
    mine, upstream = ours["mm_train_inputs"], theirs["mm_train_inputs"]
    assert set(mine) == set(upstream) >= {"pixel_values", "image_grid_thw"}
    for key in upstream:
        assert torch.equal(mine[key], upstream[key]), key
    images = len(episode.images) + sum(len(urls) for urls in episode.tool_images)
    grids = upstream["image_grid_thw"].tolist()
    assert len(grids) == images  # the tool's images are trained too
    assert ours["observation_tokens"].count(PAD) == sum(t * h * w // 4 for t, h, w in grids)

    assert len(ours_actor.calls) == len(theirs_actor.calls) == 3
    for (our_ids, our_data), (their_ids, their_data) in zip(ours_actor.calls, theirs_actor.calls, strict=True):
        assert our_ids == their_ids  # pads expanded: the actor collapses them itself
        assert our_data.keys() == their_data.keys() == {"image"}
        assert [pixels(i) for i in our_data["image"]] == [pixels(i) for i in their_data["image"]]
    assert [len(data["image"]) for _, data in ours_actor.calls] == [
        len(episode.images),
        len(episode.images) + len(episode.tool_images[0]),
        images,
    ]


def test_the_row_images_can_travel_in_the_agent_task(processor: Any) -> None:
    """A prepared row keeps its images in the task row; OpenRLHF then passes none, and the episode is the same."""
    episode = Episode(1)
    _, expected, _, _ = run_both(episode, processor)
    actor = ReplayActor(processor.tokenizer, episode.actions)
    task = encode_task({"prompt": episode.question, "answer": "grey", "images": episode.images})
    executor = AgentExecutor(vision_recipe(episode.tool_images))
    ours = asyncio.run(executor.execute(task, "grey", vllm_params(), MAX_LENGTH, processor, actor, images=None))
    assert ours["observation_tokens"] == expected["observation_tokens"]
    for key, value in expected["mm_train_inputs"].items():
        assert torch.equal(ours["mm_train_inputs"][key], value)
    assert ours["images"] is None  # echoed as OpenRLHF got it


def test_each_compacted_segment_carries_its_own_images_and_tensors(processor: Any) -> None:
    """A compacting recipe: the first segment holds the prompt's images and the first zoom's, the second (the
    prompt again, then the summary) the prompt's and the second zoom's. Each record's ids and tensors are what
    OpenRLHF's `process_prompt_with_images` makes of that segment's whole text and images."""
    from openrlhf.utils.vlm_utils import process_prompt_with_images

    episode = Episode(1)
    actions = [zoom(0), "The crop is grey.<|im_end|>", zoom(1), ANSWER]
    actor = ReplayActor(processor.tokenizer, actions)
    compaction = CompactionPolicy(compact_at_tokens=1, max_compactions=1)
    executor = AgentExecutor(vision_recipe(episode.tool_images, context=compaction))
    record = asyncio.run(
        executor.execute(episode.question, "grey", vllm_params(), MAX_LENGTH, processor, actor, images=episode.images)
    )
    segments = [*record[SEGMENTS_KEY], record]
    assert record["extra_logs"]["agent_compactions"] == 1.0 and len(segments) == 2
    for segment, tool_images in zip(segments, episode.tool_images, strict=True):
        ids = segment["observation_tokens"]
        text = processor.tokenizer.decode(dedup_media_tokens(ids, {PAD}), skip_special_tokens=False)
        theirs, inputs, _ = process_prompt_with_images(processor, text, [*episode.images, *tool_images])
        assert ids == theirs
        assert segment["images"] == episode.images
        assert set(segment["mm_train_inputs"]) == set(inputs)
        for key, value in inputs.items():
            assert torch.equal(segment["mm_train_inputs"][key], value), key


def test_images_that_do_not_fit_end_the_episode_and_never_reach_the_record(processor: Any) -> None:
    """OpenRLHF drops an overflowing feedback's images (and strips their pads) and goes on; the session ends the
    episode (context_exhausted) before the feedback enters the transcript. Either way the record's pads are exactly
    its images'."""
    episode = Episode(2)
    actor = ReplayActor(processor.tokenizer, episode.actions)
    prompt_tokens = len(processor(text=[episode.prompt_text], images=_pil(episode.images))["input_ids"][0])
    limit = prompt_tokens + len(processor.tokenizer.encode(zoom(0))) + 8  # the first zoom fits, its images do not
    executor = AgentExecutor(vision_recipe(episode.tool_images, max_new_tokens=64))
    ours = asyncio.run(
        executor.execute(episode.question, "grey", vllm_params(), limit, processor, actor, images=episode.images)
    )
    assert ours["extra_logs"]["agent_error_context_exhausted"] == 1.0
    assert len(actor.calls) == 1
    tokens = ours["observation_tokens"]
    assert tokens == actor.calls[0][0] + processor.tokenizer.encode(zoom(0))
    grids = ours["mm_train_inputs"]["image_grid_thw"].tolist()
    assert len(grids) == len(episode.images)
    assert tokens.count(PAD) == sum(t * h * w // 4 for t, h, w in grids)


def test_a_generated_image_pad_ends_the_episode_before_it_reaches_the_record(processor: Any) -> None:
    episode = Episode(0)
    actions = ["<|vision_start|><|image_pad|><|vision_end|><|im_end|>"]
    actor = ReplayActor(processor.tokenizer, actions)
    executor = AgentExecutor(vision_recipe(episode.tool_images))
    ours = asyncio.run(
        executor.execute(episode.question, "grey", vllm_params(), MAX_LENGTH, processor, actor, images=episode.images)
    )
    assert ours["extra_logs"]["agent_error_engine_bad_output"] == 1.0
    assert ours["observation_tokens"] == actor.calls[0][0]  # the prompt alone, its images' pads and no other
    assert ours["action_ranges"] == []
    assert len(ours["mm_train_inputs"]["image_grid_thw"]) == len(episode.images)


def _pil(urls: list[str]) -> list[Any]:
    from openrlhf.utils.vlm_utils import load_images

    return load_images(list(urls))


def test_a_text_only_recipe_refuses_images(processor: Any) -> None:
    from tests.agent_train.conftest import calculator_recipe

    executor = AgentExecutor(calculator_recipe())
    image = data_url(9, 9)
    with pytest.raises(ValueError, match="text-only"):
        asyncio.run(executor.execute("Hi", "", vllm_params(), 256, processor, None, images=[image]))
    task = encode_task({"prompt": "Hi", "images": [image]})
    with pytest.raises(ValueError, match="text-only"):
        asyncio.run(executor.execute(task, "", vllm_params(), 256, processor, None, images=None))


def test_as_tokenizer_takes_the_processor_with_its_image_grid(processor: Any) -> None:
    ours = as_tokenizer(processor)
    assert ours.vision == processor_vision_grid(processor) == GRID  # type: ignore[attr-defined]
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>"
    assert ours.encode(text) == processor.tokenizer.encode(text, add_special_tokens=False)
    assert as_tokenizer(processor.tokenizer).vision is None  # type: ignore[attr-defined]


def test_images_are_placed_where_openrlhfs_prompt_dataset_renders_them() -> None:
    a, b = data_url(5, 5), data_url(6, 6)
    image = {"type": "image_url", "image_url": {"url": a}}
    image_b = {"type": "image_url", "image_url": {"url": b}}
    # tags: each becomes the next image where it sits, the text around it stripped (`_str_to_content_list`)
    for text in ("<image>What?", "Look <image> and <image> now", "<image><image>"):
        placed = place_images(text, [a, b][: text.count("<image>")])
        upstream = _str_to_content_list(text)
        urls = iter([a, b])
        assert placed[0]["content"] == [
            {"type": "image_url", "image_url": {"url": next(urls)}} if p["type"] == "image" else p for p in upstream
        ]
    # no tag: the images first in the first user message
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What?"}]
    assert place_images(messages, [a, b])[1]["content"] == [image, image_b, {"type": "text", "text": "What?"}]
    # {"type": "image"} parts of a message list are filled in order
    parts = [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image"}]}]
    assert place_images(parts, [a])[0]["content"] == [{"type": "text", "text": "x"}, image]
    with pytest.raises(ValueError, match=r"2 image placeholders .* 1 images"):
        place_images("<image><image>", [a])
    with pytest.raises(ValueError, match="no user message"):
        place_images([{"role": "system", "content": "x"}], [a])
    assert decode_task("Hi", images=[], vision=True).prompt == "Hi"
    user = {"role": "user", "content": [image, {"type": "text", "text": "Hi"}]}
    assert decode_task("Hi", images=(a,), vision=True).prompt == [user]
    assert dataset_images(None) == dataset_images([None]) == () and dataset_images(a) == (a,)
    # a prompt that shows its images itself is kept; the row's list is then the tools' (no picture shown twice)
    shown = decode_task(encode_task({"prompt": [user], "images": [a]}), vision=True)
    assert shown.prompt == [user] and shown.row["images"] == [a]
    with pytest.raises(ValueError, match=r"images\[1\]: http image URLs are not fetched"):
        dataset_images([a, "http://example.com/x.png"])


def test_the_launcher_passes_the_recipes_image_flags(tmp_path: Path) -> None:
    recipe = vision_recipe([], max_images=3)
    config = LaunchConfig(recipe="look", pretrain="Qwen/Qwen3-VL-2B-Instruct", algorithm="grpo", run_dir=str(tmp_path))
    plan = plan_launch(config, recipe)
    flags = plan.train_args
    assert flags[flags.index("--data.image_key") + 1] == "images"
    assert flags[flags.index("--data.max_images_per_prompt") + 1] == "3"
    checked = check_plan(plan)  # OpenRLHF's own parser and checks (no critic, no packing for a VLM)
    assert checked.args.data.max_images_per_prompt == 3 and checked.args.data.image_key == "images"
    from tests.agent_train.conftest import calculator_recipe

    assert image_flags(calculator_recipe()) == []
    with pytest.raises(LaunchError, match=r"Recipe\.max_images"):
        plan_launch(config, vision_recipe([], max_images=None))
