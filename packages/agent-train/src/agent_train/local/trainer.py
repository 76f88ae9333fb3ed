"""The local trainer: the demo agent from nothing to a trained model on one CPU machine, in the visible steps
of `train_local`.

    result = train_local(LocalTrainConfig(), Path("runs/demo"))      # or resume=True to continue a run
    result.figures     # {"before": 0.0, "after_sft": 0.3, "after_rl": 0.6}: held-out success, greedy

1. tokenizer: a byte-level BPE trained on the task's conversations, with Qwen3's special tokens;
2. model: a tiny Qwen3 from `DemoModelSpec`, served by the `hf` engine (which shares its weights, so every
   optimizer step is live for the next rollout, as a weight sync would make it);
3. held-out success before training;
4. SFT: expert episodes from the scripted expert through the recipe's `AgentSession`, cross-entropy on their
   action tokens; held-out success every `sft_eval_every` steps and after SFT; the SFT model is saved (the KL
   reference);
5. RL: each step samples `rl_prompts` training prompts `rl_group_size` times through `AgentRuntime` (`Rollouts`:
   one record per segment, read from the episode's transcript records), computes the `rl_estimator`'s advantages
   and takes a policy-gradient step on the action tokens; with `rl_dynamic_filtering` (DAPO) the groups whose
   rewards are all equal are dropped and new prompts are sampled to refill the step, for at most
   `rl_filter_rounds` rounds; held-out success every `eval_every` steps and at the end; with `rl_async` K the
   batches are sampled ahead on a copy of the weights, at most K versions stale (`agent_train.local.pipeline`);
6. the final model (a Hugging Face directory), the metrics JSONL, the learning-curve PNG and ``summary.json``.

Run directory: ``metrics.jsonl``, ``learning_curve.png``, ``summary.json``, ``checkpoint/`` (latest, with
trainer state; what ``resume`` reads), ``sft/`` and ``final/`` (model directories); with `tensorboard_dir`, the
metrics also as TensorBoard event files there (`agent_train.local.tensorboard_events`); with `trajectories` (the
default), ``trajectories/``: every RL step's, evaluation's and expert's episodes as the trajectory viewer reads them
(`agent_train.local.trajectory_log`). This module wires the
pieces of `agent_train.local` together; each step's mechanics live in its own module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import random
import shutil
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack

import msgspec
import structlog
import torch
from tqdm import tqdm  # type: ignore[import-untyped]

from agent_protocol import HFTokenizer
from agent_runtime import BudgetPolicy, Recipe
from agent_runtime.engines import HFEngine
from agent_train.demo.model import build_demo_model, load_demo_model, save_model_dir
from agent_train.errors import TrainError
from agent_train.local.checkpoint import Checkpoint, TrainerState, load_checkpoint, save_checkpoint
from agent_train.local.config import ISMode, LocalTrainConfig, check_config
from agent_train.local.demos import Demo, get_demo
from agent_train.local.evaluate import EvalResult, evaluate
from agent_train.local.lockstep import LockstepEngine
from agent_train.local.metrics import MetricsWriter, read_metrics
from agent_train.local.pipeline import RolloutPipeline, fresh_records, snapshot, staleness_stats, staleness_totals
from agent_train.local.plot import plot_metrics
from agent_train.local.rl import episode_advantages, informative_groups, rl_update, trained_records
from agent_train.local.rollout import ROLLOUT_BATCHING, RolloutRecord, Rollouts
from agent_train.local.sft import SFTExample, expert_trajectories, learns_from, sample_batch, sft_examples, sft_step
from agent_train.local.trajectory_log import TrajectoryLog

__all__ = ["TrainOptions", "TrainResult", "sft_learning_rate", "train_local", "train_local_async"]

logger = structlog.get_logger(__name__)


@dataclass
class TrainResult:
    """What a run produced: held-out success `figures` (``before``, ``after_sft``, ``after_rl``) and paths."""

    run_dir: Path
    model_dir: Path
    figures: dict[str, float]
    elapsed_s: float
    config: LocalTrainConfig
    eval_episodes: int
    finished: bool = True  # False when `stop_after` paused the run (resume it with resume=True)
    files: dict[str, Path] = field(default_factory=dict)
    #: asynchronous RL: the trained episodes by staleness ("0", "1", ...) and "dropped", summed over the steps
    staleness: dict[str, int] = field(default_factory=dict)


class TrainOptions(TypedDict, total=False):
    """`train_local`'s keyword options; `train_local_async` takes the same, and holds their defaults."""

    resume: bool
    progress: bool
    recipe: Recipe | None
    stop_after: int | None
    branch_from: str | Path | None
    tensorboard_dir: str | Path | None
    trajectories: bool | str | Path


def train_local(
    config: LocalTrainConfig | None = None, run_dir: str | Path = "runs/demo", **options: Unpack[TrainOptions]
) -> TrainResult:
    """Train the demo agent (see the module docstring). Blocking; safe to call from inside an event loop.

    `resume` continues from ``run_dir/checkpoint`` when there is one (with the same config). `stop_after` pauses
    the run once that many steps (SFT + RL) are done: it checkpoints and returns with ``finished=False``.
    `branch_from` starts RL from another run's SFT model (its ``rl_start``), with RL options of this config (the
    ablation of a compacting run: ``rl_mask_summaries``). `tensorboard_dir`: also write the metrics as TensorBoard
    event files in that directory (the run's own; its earlier event files are replaced). `trajectories`: write
    the episodes under ``run_dir/trajectories`` (`TrajectoryLog`), or in that directory; False: nowhere. Defaults:
    not resumed, a progress bar, the demo's recipe, no pause, no branch, no TensorBoard files, trajectories on."""
    return _run_sync(train_local_async(config, run_dir, **options))


def _run_sync[T](coroutine: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coroutine)
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, name="local-trainer")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


def sft_learning_rate(config: LocalTrainConfig, step: int) -> float:
    """The SFT learning rate at `step` (0-based): linear warmup over `sft_warmup_steps`, then constant, or, when
    `sft_final_lr_ratio` < 1, a cosine decay that reaches that fraction of `sft_lr` on the last step."""
    warmup = min(1.0, (step + 1) / max(1, config.sft_warmup_steps))
    floor = config.sft_final_lr_ratio
    if floor >= 1.0:
        return config.sft_lr * warmup
    span = max(1, config.sft_steps - config.sft_warmup_steps - 1)
    progress = min(1.0, max(0.0, (step - config.sft_warmup_steps) / span))
    return config.sft_lr * warmup * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


class _Run:
    """The state one run carries between its phases."""

    def __init__(
        self,
        config: LocalTrainConfig,
        run_dir: Path,
        recipe: Recipe | None,
        progress: bool,
        stop_after: int | None,
        branch_from: Path | None = None,
        tensorboard_dir: Path | None = None,
        trajectories: bool | str | Path = True,
    ) -> None:
        self.config = config
        self.demo: Demo = get_demo(config.demo)
        recipe = recipe or self.demo.make_recipe()
        self.branch_from = branch_from
        self.stop_after = stop_after
        self.run_dir = run_dir
        self.tensorboard_dir = tensorboard_dir
        logged = run_dir / "trajectories" if trajectories is True else trajectories
        self.trajectory_log = None if logged is False else TrajectoryLog(logged)
        self.recipe = recipe
        self.progress = progress
        self.protocol = recipe.chat_protocol()
        self.checkpoint_dir = run_dir / "checkpoint"
        self.rng = random.Random(config.seed)
        self.optimizer: torch.optim.Optimizer | None = None

    # -- setup ---------------------------------------------------------------------------------------------

    def start(self, resume: bool) -> None:
        config = self.config
        checkpoint = load_checkpoint(self.checkpoint_dir) if resume else None
        if checkpoint is None and self.branch_from is not None:
            checkpoint = self.branch(self.branch_from)
        if checkpoint is not None:
            if checkpoint.state.config != config:
                raise TrainError(
                    f"{self.checkpoint_dir} was written with a different configuration; resume it with the same "
                    "options, or start a new run (another --run-dir, or without --resume)"
                )
            self.model, self.raw_tokenizer, self.state = checkpoint.model, checkpoint.tokenizer, checkpoint.state
            self._restore_rng(checkpoint.rng)
            self.optimizer_state = checkpoint.optimizer_state
            logger.info("local_train_resumed", phase=self.state.phase, step=self.state.step)
        else:
            torch.manual_seed(config.seed)
            tools = self.recipe.environment().tools
            self.raw_tokenizer = self.demo.tokenizer(self.protocol, tools, config)
            self.model = build_demo_model(self.raw_tokenizer, config.model, seed=config.seed)
            self.state = TrainerState(config=config)
            self.optimizer_state = None
        self.tokenizer = HFTokenizer(self.raw_tokenizer, source="demo")
        self.pad_id = int(self.raw_tokenizer.token_to_id("<|endoftext|>"))
        # in lockstep (`agent_train.local.lockstep`): batches formed in episode order, so a seed gives one run
        self.engine = LockstepEngine(
            HFEngine(
                self.model,
                self.tokenizer,
                context_length=self.recipe.max_context_tokens,
                max_batch_size=config.max_batch_size,
                **ROLLOUT_BATCHING,
            )
        )
        self.metrics = MetricsWriter(
            self.run_dir / "metrics.jsonl",
            keep_until_step=self.state.step if checkpoint is not None else None,  # resumed or branched
            elapsed_s=self.state.elapsed_s,
            tensorboard_dir=self.tensorboard_dir,
        )
        rows = list(self.recipe.rows("train"))
        self.train_rows = rows
        held_out = list(self.recipe.rows("test"))
        if len(held_out) < config.eval_size:
            raise TrainError(f"the recipe has {len(held_out)} held-out rows; eval_size is {config.eval_size}")
        self.held_out = held_out[: config.eval_size]
        total = config.sft_steps + config.rl_steps
        self.bar = tqdm(total=total, initial=self.state.step, disable=not self.progress, desc="train", unit="step")

    def branch(self, source: Path) -> Checkpoint:
        """Start this run where run `source` started RL (its ``rl_start`` checkpoint: the SFT model, the same RNG
        state, so the same prompts are drawn), with this run's configuration, which may differ from the source's
        in RL fields only (``rl_*``): the ablation of a compacting run trains the same SFT model another way."""
        checkpoint = load_checkpoint(source / "rl_start")
        if checkpoint is None:
            raise TrainError(f"{source / 'rl_start'} holds no checkpoint; branch from a run that finished SFT")
        theirs, ours = msgspec.structs.asdict(checkpoint.state.config), msgspec.structs.asdict(self.config)
        differ = sorted(key for key in ours if ours[key] != theirs.get(key) and not key.startswith("rl_"))
        if differ:
            raise TrainError(f"a branch may change RL options only; {', '.join(differ)} differ from {source}'s")
        checkpoint.state.config = self.config
        shutil.copytree(source / "sft", self.run_dir / "sft", dirs_exist_ok=True)
        kept = [r for r in read_metrics(source / "metrics.jsonl") if int(r.get("step", 0)) <= checkpoint.state.step]
        (self.run_dir / "metrics.jsonl").write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in kept))
        logger.info("local_train_branched", source=str(source), step=checkpoint.state.step)
        return checkpoint

    def should_pause(self) -> bool:
        """True once `stop_after` steps are done; the caller checkpoints and stops."""
        return self.stop_after is not None and self.state.step >= self.stop_after

    def _rng_state(self) -> dict[str, Any]:
        return {"python": self.rng.getstate(), "torch": torch.get_rng_state()}

    def _restore_rng(self, saved: dict[str, Any]) -> None:
        if "python" in saved:
            self.rng.setstate(saved["python"])
        if "torch" in saved:
            torch.set_rng_state(saved["torch"])

    def save(self, path: Path | None = None) -> None:
        self.state.elapsed_s = self.metrics.elapsed_s
        save_checkpoint(
            path or self.checkpoint_dir,
            model=self.model,
            tokenizer=self.raw_tokenizer,
            state=self.state,
            optimizer=self.optimizer,
            rng=self._rng_state(),
        )

    # -- evaluation ----------------------------------------------------------------------------------------

    async def evaluate(self, label: str | None = None, recipe: Recipe | None = None) -> EvalResult:
        result, trajectories = await evaluate(self.engine, recipe or self.recipe, self.held_out)
        if self.trajectory_log is not None:
            self.trajectory_log.evaluation(self.state.step, trajectories, label=label)
        record = self.metrics.write("eval", step=self.state.step, label=label, **msgspec.structs.asdict(result))
        if label is not None:
            self.state.figures[label] = result.success
        self.bar.set_postfix_str(f"held-out success {result.success:.0%}")
        logger.info("local_eval", **record)
        return result

    # -- phases --------------------------------------------------------------------------------------------

    async def sft(self) -> None:
        config = self.config
        policy = self.demo.expert(self.tokenizer, self.protocol)
        rows = self.train_rows[: config.sft_episodes]
        trajectories = await expert_trajectories(self.recipe, self.tokenizer, rows, policy)
        examples: list[SFTExample] = sft_examples(trajectories, min_reward=config.sft_min_reward)
        if self.trajectory_log is not None:
            self.trajectory_log.expert(
                trajectories, trained=[learns_from(t, min_reward=config.sft_min_reward) for t in trajectories]
            )
        if not examples:
            raise TrainError("no expert episode to learn from; the recipe and the expert disagree")
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.sft_lr, betas=(0.9, 0.95))
        if self.optimizer_state is not None:
            self.optimizer.load_state_dict(self.optimizer_state)
        self.bar.set_description("SFT")
        while self.state.sft_step < config.sft_steps:
            for group in self.optimizer.param_groups:
                group["lr"] = sft_learning_rate(config, self.state.sft_step)
            loss = sft_step(
                self.model, self.optimizer, sample_batch(examples, config.sft_batch_size, self.rng), pad_id=self.pad_id
            )
            self.state.sft_step += 1
            self.metrics.write("sft", step=self.state.step, loss=round(loss, 5))
            self.bar.update(1)
            self.bar.set_postfix_str(f"loss {loss:.3f}")
            # an SFT step never awaits; yield once per step so that Ctrl-C (asyncio.run cancels this task) lands
            # within a step, not at the next evaluation
            await asyncio.sleep(0)
            if self.state.sft_step < config.sft_steps and self.state.sft_step % config.sft_eval_every == 0:
                await self.evaluate()
            if self.state.sft_step < config.sft_steps and self.should_pause():
                self.save()
                return
            if self.state.sft_step % config.checkpoint_every == 0 and self.state.sft_step < config.sft_steps:
                self.save()
        await self.evaluate("after_sft")
        save_model_dir(self.model, self.raw_tokenizer, self.run_dir / "sft")
        self.state.phase = "rl"
        self.optimizer, self.optimizer_state = None, None
        self.save()
        self.save(self.run_dir / "rl_start")  # where a branch of this run (`branch_from`) starts

    async def rl(self) -> None:
        config = self.config
        reference: Any = None
        if config.rl_kl_coef > 0:
            reference = load_demo_model(self.run_dir / "sft")
            reference.eval()
            reference.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.rl_lr, betas=(0.9, 0.95))
        if self.optimizer_state is not None:
            self.optimizer.load_state_dict(self.optimizer_state)
        self.bar.set_description("RL")
        if config.rl_async is None:
            last_eval = await self.rl_synchronous(reference)
        else:
            last_eval = await self.rl_pipelined(reference, config.rl_async)
        if last_eval is None:  # paused
            return
        if last_eval != self.state.rl_step:  # zero RL steps, or resumed at the very end
            await self.evaluate("after_rl")
        save_model_dir(self.model, self.raw_tokenizer, self.run_dir / "final")
        self.state.phase = "done"
        self.save()

    async def rl_synchronous(self, reference: Any) -> int | None:
        """The RL steps on one copy of the weights, shared with the engine: each batch sampled by the weights it
        trains. Returns the step of the last evaluation, or None when the run paused."""
        config = self.config
        rollouts = Rollouts(self.recipe, self.engine)
        last_eval = -1
        while self.state.rl_step < config.rl_steps:
            started = time.perf_counter()
            # the weights the engine shares have had `rl_step` updates (a resumed run's too): its tokens say so
            self.engine.set_policy_version(self.state.rl_step)
            prompts = self.rng.sample(self.train_rows, config.rl_prompts)
            records = await rollouts.collect(
                prompts,
                group_size=config.rl_group_size,
                temperature=config.rl_temperature,
                seed=config.seed * 1_000_003 + self.state.rl_step,
            )
            sampled, rounds = records, 1
            if config.rl_dynamic_filtering:
                records, sampled, rounds = await self.dynamic_filter(rollouts, records)
            generate_s = time.perf_counter() - started
            paused, last_eval = await self.train_step(
                records, sampled, rounds, generate_s, started, reference, last_eval
            )
            if paused:
                return None
        return last_eval

    async def rl_pipelined(self, reference: Any, ahead: int) -> int | None:
        """The RL steps with rollouts sampled ahead on a second copy of the weights (`RolloutPipeline`): batch j by
        the weights of version max(0, j - `ahead`) while the batches before it train, its episodes staler than
        `ahead` dropped, and from `ahead` = 1 on OpenRLHF's token-level IS correction. Returns as `rl_synchronous`."""
        config = self.config
        if self.state.rl_step > 0:
            raise TrainError(
                f"--async {ahead}: a run cannot resume in the middle of asynchronous RL (step {self.state.rl_step}): "
                f"the {ahead} batches in flight were sampled by weights the checkpoint does not hold; start RL again "
                "from the SFT model (apps/train --resume at the end of SFT, or a new run)"
            )
        group, temperature, seed = config.rl_group_size, config.rl_temperature, config.seed
        if ahead > 0:  # sampling overlaps the update: on a copy of the weights
            pipeline = RolloutPipeline.on_copy(
                self.recipe, self.model, self.tokenizer, ahead=ahead, group_size=group, temperature=temperature,
                seed=seed, max_batch_size=config.max_batch_size,
            )  # fmt: skip
        else:  # the update waits for each batch and each batch for the update: the trainer's engine and weights
            pipeline = RolloutPipeline(
                self.recipe, self.engine, ahead=0, group_size=group, temperature=temperature, seed=seed
            )
        is_correction = (config.rl_is_mode, config.rl_is_bounds) if ahead > 0 else None
        last_eval = -1
        try:
            weights = snapshot(self.model) if ahead > 0 else None
            for index in range(min(ahead + 1, config.rl_steps)):  # batches 0..K: version 0
                pipeline.submit(index, self.rng.sample(self.train_rows, config.rl_prompts), version=0, weights=weights)
            while self.state.rl_step < config.rl_steps:
                started = time.perf_counter()
                batch = await pipeline.next()
                version = self.state.rl_step
                records, histogram, dropped = fresh_records(batch.records, version=version, bound=ahead)
                waited_s = time.perf_counter() - started
                paused, last_eval = await self.train_step(
                    records,
                    batch.records,
                    1,
                    waited_s,
                    started,
                    reference,
                    last_eval,
                    is_correction=is_correction,
                    extra={
                        **staleness_stats(histogram, dropped),
                        "sampled_by": batch.version,
                        "sample_s": round(batch.generate_s, 2),
                    },
                    submit=lambda: self._submit_next(pipeline, ahead),
                )
                if paused:
                    return None
        finally:
            await pipeline.close()
        return last_eval

    def _submit_next(self, pipeline: RolloutPipeline, ahead: int) -> None:
        """After update v - 1: batch v + `ahead` goes to the pipeline, to be sampled by version v (the weights now)."""
        index = self.state.rl_step + ahead
        if index < self.config.rl_steps:
            prompts = self.rng.sample(self.train_rows, self.config.rl_prompts)
            weights = snapshot(self.model) if ahead > 0 else None
            pipeline.submit(index, prompts, version=self.state.rl_step, weights=weights)

    async def train_step(
        self,
        records: list[RolloutRecord],
        sampled: list[RolloutRecord],
        rounds: int,
        generate_s: float,
        started: float,
        reference: Any,
        last_eval: int,
        *,
        is_correction: tuple[ISMode, tuple[float, float]] | None = None,
        extra: dict[str, Any] | None = None,
        submit: Callable[[], None] | None = None,
    ) -> tuple[bool, int]:
        """One RL step on `records` (of `sampled`): advantages, the update, metrics, trajectories, evaluation and
        checkpoint. With `is_correction` the update runs on a worker thread, so that the event loop goes on
        feeding the rollout engine, and `submit` runs right after it (the next batch's weights are then these).
        Returns (paused, the step of the last evaluation)."""
        config = self.config
        assert self.optimizer is not None
        for group in self.optimizer.param_groups:
            group["lr"] = config.rl_lr * min(1.0, (self.state.rl_step + 1) / max(1, config.rl_warmup_steps))
        trained, advantages = trained_records(
            records,
            episode_advantages(records, config.rl_estimator),
            mask_summaries=config.rl_mask_summaries,
            mask_overlong=config.rl_mask_overlong,
        )
        update = functools.partial(
            rl_update,
            self.model,
            self.optimizer,
            trained,
            advantages,
            pad_id=self.pad_id,
            ref_model=reference,
            kl_coef=config.rl_kl_coef,
            clip_eps=config.rl_clip_eps,
            minibatches=config.rl_minibatches,
            rng=self.rng,
            is_correction=is_correction,
        )
        stats = update() if config.rl_async is None else await asyncio.to_thread(update)
        self.state.rl_step += 1
        if submit is not None:
            submit()
        episodes = {r.episode: r for r in sampled}.values()  # one record per episode (its last segment)
        reward = sum(r.reward for r in episodes) / max(1, len(episodes))
        filtering: dict[str, int] = {}
        if config.rl_dynamic_filtering:
            filtering = {
                "groups_sampled": len({r.group for r in sampled}),
                "groups_trained": len({r.group for r in records}),
                "rounds": rounds,
            }
        self.metrics.write(
            "rl",
            step=self.state.step,
            reward=round(reward, 4),
            tool_calls=round(
                sum(r.extra_logs.get("agent_tool_calls", 0.0) for r in episodes) / max(1, len(episodes)), 3
            ),
            **self.compaction_stats(list(episodes), sampled),
            **filtering,
            generate_s=round(generate_s, 2),
            update_s=round(time.perf_counter() - started - generate_s, 2),
            **{k: round(v, 5) for k, v in stats.items()},
            **(extra or {}),
        )
        if self.trajectory_log is not None:
            self.trajectory_log.rl_step(self.state.step, sampled, trained, advantages)
        self.bar.update(1)
        self.bar.set_postfix_str(f"reward {reward:.2f}")
        if self.state.rl_step % config.eval_every == 0 or self.state.rl_step == config.rl_steps:
            await self.evaluate("after_rl" if self.state.rl_step == config.rl_steps else None)
            last_eval = self.state.rl_step
        if self.state.rl_step < config.rl_steps and self.should_pause():
            self.save()
            return True, last_eval
        if self.state.rl_step % config.checkpoint_every == 0 and self.state.rl_step < config.rl_steps:
            self.save()
        return False, last_eval

    async def dynamic_filter(
        self, rollouts: Rollouts, records: list[RolloutRecord]
    ) -> tuple[list[RolloutRecord], list[RolloutRecord], int]:
        """DAPO's dynamic filtering, refilled as OpenRLHF's `SamplesGenerator._generate_vllm` does (a new prompt for
        each filtered one): keeps the groups whose rewards differ, samples that many new prompts again until
        `rl_prompts` groups passed or `rl_filter_rounds` rounds ran, and trains on at most `rl_prompts` groups.
        Returns the kept records, every sampled record, and the rounds it took."""
        config = self.config
        kept, sampled, rounds = informative_groups(records), list(records), 1
        while rounds < config.rl_filter_rounds and (missing := config.rl_prompts - len({r.group for r in kept})) > 0:
            offset = 1 + max((r.group for r in sampled), default=-1)  # group ids stay unique across rounds
            more = await rollouts.collect(
                self.rng.sample(self.train_rows, missing),
                group_size=config.rl_group_size,
                temperature=config.rl_temperature,
                seed=config.seed * 1_000_003 + self.state.rl_step + 1_000_000 * rounds,
            )
            first = 1 + max((r.episode for r in sampled), default=-1)  # and so do episode ids
            more = [msgspec.structs.replace(r, group=r.group + offset, episode=r.episode + first) for r in more]
            sampled += more
            kept += informative_groups(more)
            rounds += 1
        groups = sorted({r.group for r in kept})[: config.rl_prompts]
        return [r for r in kept if r.group in set(groups)], sampled, rounds

    def compaction_stats(self, episodes: list[RolloutRecord], sampled: list[RolloutRecord]) -> dict[str, float]:
        """For a recipe that compacts: segments trained per episode, compactions per episode and the fraction of
        episodes the budget ended (overlong); nothing for one that does not, so its metrics read as before."""
        if isinstance(self.recipe.context, BudgetPolicy):
            return {}
        count = max(1, len(episodes))
        return {
            "segments": round(len(sampled) / count, 3),
            "compactions": round(sum(r.extra_logs.get("agent_compactions", 0.0) for r in episodes) / count, 3),
            "overlong": round(sum(r.overlong for r in episodes) / count, 3),
        }

    async def without_compaction(self) -> None:
        """The final model on the held-out problems with compaction off (the budget ends an episode that
        outgrows its context): what summaries are worth. Only for a recipe that compacts."""
        if isinstance(self.recipe.context, BudgetPolicy) or "compaction_off" in self.state.figures:
            return
        await self.evaluate("compaction_off", dataclasses.replace(self.recipe, context=BudgetPolicy()))
        self.save()

    def finish(self) -> TrainResult:
        self.bar.close()
        records = read_metrics(self.metrics.path)
        files = {
            "metrics": self.metrics.path,
            "plot": plot_metrics(records, self.run_dir / "learning_curve.png", title=self.demo.plot_title),
            "checkpoint": self.checkpoint_dir,
            **({"tensorboard": self.tensorboard_dir} if self.tensorboard_dir is not None else {}),
            **({"trajectories": self.trajectory_log.directory} if self.trajectory_log is not None else {}),
        }
        result = TrainResult(
            run_dir=self.run_dir,
            model_dir=self.run_dir / "final",
            figures=dict(self.state.figures),
            elapsed_s=self.metrics.elapsed_s,
            config=self.config,
            eval_episodes=len(self.held_out),
            finished=self.state.phase == "done",
            files=files,
            staleness=staleness_totals(records) if self.config.rl_async is not None else {},
        )
        summary = {
            "finished": result.finished,
            "figures": result.figures,
            "eval_episodes": result.eval_episodes,
            "seed": self.config.seed,
            "demo": self.config.demo,
            "elapsed_s": round(result.elapsed_s, 1),
            "model_dir": str(result.model_dir),
            "config": msgspec.to_builtins(self.config),
            **({"rl_staleness": result.staleness} if self.config.rl_async is not None else {}),
        }
        (self.run_dir / "summary.json").write_bytes(msgspec.json.format(msgspec.json.encode(summary)) + b"\n")
        files["summary"] = self.run_dir / "summary.json"
        logger.info("local_train_finished", figures=result.figures, elapsed_s=round(result.elapsed_s, 1))
        return result


async def train_local_async(
    config: LocalTrainConfig | None = None,
    run_dir: str | Path = "runs/demo",
    *,
    resume: bool = False,
    progress: bool = True,
    recipe: Recipe | None = None,
    stop_after: int | None = None,
    branch_from: str | Path | None = None,
    tensorboard_dir: str | Path | None = None,
    trajectories: bool | str | Path = True,
) -> TrainResult:
    """`train_local` for callers already in an event loop (the engine's worker thread does the heavy work, but the
    optimizer steps run on the loop's thread)."""
    try:
        config = check_config(config or LocalTrainConfig())
    except ValueError as e:
        raise TrainError(str(e)) from None
    run = _Run(
        config,
        Path(run_dir),
        recipe,
        progress,
        stop_after,
        None if branch_from is None else Path(branch_from),
        None if tensorboard_dir is None else Path(tensorboard_dir),
        trajectories,
    )
    total = config.sft_steps + config.rl_steps
    if config.rl_async is not None and stop_after is not None and config.sft_steps < stop_after < total:
        raise TrainError(
            f"stop_after {stop_after} falls inside asynchronous RL (steps {config.sft_steps + 1}-{total}), which "
            f"cannot resume from the middle; pause at the end of SFT (stop_after {config.sft_steps}) or not at all"
        )
    run.run_dir.mkdir(parents=True, exist_ok=True)
    run.start(resume)  # raises before anything is started when the checkpoint does not fit the config
    try:
        if "before" not in run.state.figures:
            await run.evaluate("before")
        if run.state.phase == "sft" and not run.should_pause():
            await run.sft()
        if run.state.phase == "rl" and not run.should_pause():
            await run.rl()
        if run.state.phase == "done":
            await run.without_compaction()
        return run.finish()
    finally:
        run.bar.close()
        run.metrics.close()
        await run.engine.close()
