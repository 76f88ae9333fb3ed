"""Every segment of a compacted episode trained by OpenRLHF 0.11.2, with the episode's advantage.

OpenRLHF trains one token sequence per `execute` call, and its group estimators (``group_norm``, ``dr_grpo``,
``rloo``, ``reinforce_baseline``) compare the `n_samples_per_prompt` consecutive samples of a prompt. A compacted
episode is several sequences (each segment holds exactly the context its tokens were sampled under), so this
small extension, pinned to OpenRLHF 0.11.2 and installed by `install()`, changes three things:

- the executor returns the episode's last segment as OpenRLHF's usual dict, with the earlier segments (each
  ending with its summary turn) under `SEGMENTS_KEY` and `OVERLONG_KEY` set on an episode that ran out of budget
  without answering (`episode_record`); a plain episode's dict is exactly what OpenRLHF gets without the
  extension, and OpenRLHF without it trains the last segment as before;
- `SamplesGenerator._process_response_into_experience` makes the earlier segments `Experience`s too and hangs
  them on the episode's `Experience`, so everything between generation and training (DAPO's dynamic filtering
  on ``scores``, the buffer cut into `batch_size x n_samples_per_prompt` chunks, evaluation) still sees one
  sample per episode;
- `RemoteExperienceMaker.make_experience_batch` unfolds the segments into samples, runs OpenRLHF's forward
  passes on all of them, and computes the advantage at the episode level with OpenRLHF's own
  `compute_advantages_and_returns`, twice: once over one stand-in per episode in today's layout (episode
  ``i`` at index ``i``, so the groups are the `n_samples_per_prompt` episodes of a prompt, with OpenRLHF's length
  penalties), keeping the shaped reward each episode gets (the argument of `compute_reward`); then over every
  segment, with each segment's `compute_reward` given its episode's shaped reward, so OpenRLHF's per-token part
  (KL in the reward, returns, GAE, the batch whitening of ``reinforce``/``reinforce_baseline``/``gae``) runs on
  each segment as on any sample. A batch without compaction and without an over-long episode goes through
  OpenRLHF's own method untouched.

Broadcast, not discounted: every segment's tokens get the episode's advantage (ReSum-GRPO's "advantage
broadcasting" of the trajectory-level GRPO advantage to every segment; SUPO's derivation that the policy gradient
of a summarized rollout is the sum of the gradients of its sub-trajectories under the rollout's return). The
reward comes only at the end of the episode, and a summary is good exactly when the episode it lets continue ends
well; discounting per segment would pay earlier summaries less for the same outcome.

Loss normalization: unchanged, OpenRLHF's ``--actor.loss_agg_mode``. With ``token-mean`` (every preset) each
trained token weighs the same whichever segment holds it, and an episode's gradient is the sum over its segments,
as in SUPO and in DAPO's token-level loss: the summary turns weigh as much per token as the answer. A per-episode
mean (dividing by the segment count) would shrink the gradient of exactly the episodes that compacted. With
``seq-mean-token-mean`` each segment is a sequence, as each segment is a training sample in ReSum-GRPO. The
batch whitening of ``reinforce``/``reinforce_baseline`` runs over every trained token of every segment.

Over-long episodes (`OVERLONG_KEY`: stopped by the context or step budget, or cut by the length limit, without an
answer) are masked as SUPO masks rollouts that do not finish within their summary and step limits, so the model
is not pushed to compact forever: their reward still counts in their group's baseline, their tokens get advantage
0 and stay out of the whitening statistics. They stay in the loss's token count (and the KL loss), which keeps the
loss finite when a whole step is over-long. On by default; ``AGENT_MASK_OVERLONG=0`` turns it off.

Processes: the trainer (or, in async mode, the generator and training actors) needs the extension; the rollout
actors only run the executor. `agent_train.openrlhf.main` installs it in the driver and, through
``RAY_RUNTIME_ENV_HOOK`` (`runtime_env_hook`), in every Ray worker as its `worker_process_setup_hook`
(`setup_worker`). Caveat: OpenRLHF sizes its learning-rate schedule from prompts x `n_samples_per_prompt`; segments
add samples, so a compacting run takes more optimizer steps per rollout than that schedule planned.

References: ReSum-GRPO, arXiv 2509.13313 (https://arxiv.org/html/2509.13313v3); SUPO, arXiv 2510.06727
(https://ar5iv.arxiv.org/html/2510.06727; overlong masking as summarized in https://papers.lunadong.com/paper/485);
Context Folding / FoldGRPO, arXiv 2510.11967 (https://context-folding.github.io), which likewise trains the
folded branches of one trajectory under its trajectory-level group advantage.
This module imports torch and OpenRLHF only inside `install()` and the functions it installs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from typing import Any, Final

from agent_train.errors import TrainError
from agent_train.openrlhf import cpu_bridges, cpu_checks
from agent_train.openrlhf.optional_flash_attn import load_ring_attn_utils
from agent_train.sample import RolloutSample

__all__ = [
    "MASK_OVERLONG_ENV",
    "OPENRLHF_VERSION",
    "OVERLONG_KEY",
    "PINNED",
    "SEGMENTS_KEY",
    "SegmentExtensionError",
    "SegmentedRecord",
    "check_pins",
    "episode_record",
    "install",
    "installed",
    "mask_overlong",
    "runtime_env_hook",
    "setup_worker",
    "uninstall",
]

OPENRLHF_VERSION: Final = "0.11.2"
SEGMENTS_KEY: Final = "agent_segments"
"""The key of the executor's dict holding the episode's earlier segments, each an OpenRLHF dict of its own."""
OVERLONG_KEY: Final = "agent_overlong"
"""The key set (to True) on the dict of an episode that ran out of budget without answering."""
MASK_OVERLONG_ENV: Final = "AGENT_MASK_OVERLONG"
SETUP_HOOK: Final = "agent_train.openrlhf.segments.setup_worker"

_SAMPLES: Final = "openrlhf.trainer.ppo_utils.samples_generator"
_MAKER: Final = "openrlhf.trainer.ppo_utils.experience_maker"
PINNED: Final[dict[str, str]] = {
    f"{_SAMPLES}:SamplesGenerator._process_response_into_experience": "f99fc0dd86a8ebb5",
    f"{_SAMPLES}:SamplesGenerator._generate_vllm": "e31c2c4b19657950",
    f"{_MAKER}:RemoteExperienceMaker.make_experience_batch": "d8cad5d9cfb7c012",
    f"{_MAKER}:RemoteExperienceMaker.split_rollout_samples": "c7286645b395b71a",
    f"{_MAKER}:RemoteExperienceMaker.compute_advantages_and_returns": "43a58ae8e1c4aea2",
    "openrlhf.models.utils:compute_reward": "8970a8ea6dda5716",
}
"""The OpenRLHF functions the extension replaces or relies on, by the first 16 hex digits of the sha256 of their
source in OpenRLHF 0.11.2: the two it wraps, the method it replaces, and the three whose behaviour it builds on
(the generation loop that calls the wrapped method, the sample split that sets `index`, the advantage code and
the `compute_reward` call it intercepts)."""

_SEGMENTS_ATTR: Final = "agent_segments"
_OVERLONG_ATTR: Final = "agent_overlong"
_ORIGINAL: dict[str, Any] = {}


class SegmentExtensionError(TrainError):
    """The installed OpenRLHF is not the one this extension is pinned to, or a batch cannot be trained by it."""


class SegmentedRecord(dict[str, Any]):
    """The dict of an episode with earlier segments. It cannot reach OpenRLHF's trainer silently untrained: when a
    process that has loaded OpenRLHF's sample generator receives it (unpickles it, as Ray does with a rollout
    actor's answer) without the extension installed, it raises `SegmentExtensionError` naming the fix, which stops
    the job, instead of OpenRLHF training the last segment only."""

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return _arrive, (dict(self),)


def _arrive(record: dict[str, Any]) -> SegmentedRecord:
    if _SAMPLES in sys.modules and not installed():
        raise SegmentExtensionError(
            f"an episode with {len(record.get(SEGMENTS_KEY) or [])} earlier segment(s) (a compacted episode) reached "
            f"OpenRLHF in process {os.getpid()} without agent-train's segment extension, so only its last segment "
            "would be trained. Start the job with `python -m agent_train.openrlhf.main` (as `apps/train --backend "
            "openrlhf` does), which installs the extension in every Ray worker; a Ray started elsewhere needs "
            f"`worker_process_setup_hook={SETUP_HOOK!r}` in its runtime env, and a driver under `uv run` needs "
            "RAY_ENABLE_UV_RUN_RUNTIME_ENV=0"
        )
    return SegmentedRecord(record)


def episode_record(segments: Sequence[RolloutSample]) -> dict[str, Any]:
    """OpenRLHF's dict for one episode given its segment records in order: the last segment's dict, with the
    earlier ones under `SEGMENTS_KEY` (only when there are any: then it is a `SegmentedRecord`) and `OVERLONG_KEY`
    (only when set)."""
    if not segments:
        raise ValueError("an episode has at least one segment")
    *earlier, last = segments
    record = last.to_openrlhf()
    if earlier:
        record = SegmentedRecord(record, **{SEGMENTS_KEY: [segment.to_openrlhf() for segment in earlier]})
    if last.overlong:
        record[OVERLONG_KEY] = True
    return record


def mask_overlong() -> bool:
    """Whether over-long episodes are masked: unless ``AGENT_MASK_OVERLONG`` is ``0`` (read at each batch)."""
    return os.environ.get(MASK_OVERLONG_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _resolve(target: str) -> Any:
    module_name, qualname = target.split(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return _ORIGINAL.get(target, obj)


def source_digest(target: str) -> str:
    """The first 16 hex digits of the sha256 of the source of `target` (``module:Qualified.name``), as installed
    before the extension touched it."""
    return hashlib.sha256(inspect.getsource(_resolve(target)).encode()).hexdigest()[:16]


def check_pins() -> None:
    """Raise `SegmentExtensionError` unless OpenRLHF is 0.11.2 and every `PINNED` function is as pinned."""
    try:
        found = installed_version("openrlhf")
    except PackageNotFoundError as e:
        raise SegmentExtensionError("openrlhf is not installed; the segment extension patches it") from e
    if found != OPENRLHF_VERSION:
        raise SegmentExtensionError(
            f"the segment extension is pinned to OpenRLHF {OPENRLHF_VERSION}, found {found}: re-read its internals "
            "(agent_train/openrlhf/segments.py, PINNED) before training compacted episodes with it"
        )
    changed = [target for target, digest in PINNED.items() if source_digest(target) != digest]
    if changed:
        raise SegmentExtensionError(f"OpenRLHF {found} differs from the pinned source in: {', '.join(changed)}")


def installed() -> bool:
    """Whether the extension is installed in this process."""
    return bool(_ORIGINAL)


def install() -> None:
    """Check the pins and patch OpenRLHF in this process (idempotent). With ``AGENT_OPENRLHF_DEVICE=cpu`` it
    applies the CPU bridges too (`cpu_bridges`)."""
    if _ORIGINAL:
        return
    load_ring_attn_utils()  # OpenRLHF imports flash-attn at import time; without it, only its callers fail
    check_pins()
    if cpu_bridges.cpu_requested():
        cpu_bridges.install()
    samples = importlib.import_module(_SAMPLES)
    maker = importlib.import_module(_MAKER)
    _ORIGINAL[f"{_SAMPLES}:SamplesGenerator._process_response_into_experience"] = (
        samples.SamplesGenerator._process_response_into_experience
    )
    _ORIGINAL[f"{_MAKER}:RemoteExperienceMaker.make_experience_batch"] = (
        maker.RemoteExperienceMaker.make_experience_batch
    )
    samples.SamplesGenerator._process_response_into_experience = _process_response_into_experience
    maker.RemoteExperienceMaker.make_experience_batch = _make_experience_batch


def uninstall() -> None:
    """Put OpenRLHF's own methods back (idempotent)."""
    if not _ORIGINAL:
        return
    samples = importlib.import_module(_SAMPLES)
    maker = importlib.import_module(_MAKER)
    samples.SamplesGenerator._process_response_into_experience = _ORIGINAL.pop(
        f"{_SAMPLES}:SamplesGenerator._process_response_into_experience"
    )
    maker.RemoteExperienceMaker.make_experience_batch = _ORIGINAL.pop(
        f"{_MAKER}:RemoteExperienceMaker.make_experience_batch"
    )


def setup_worker() -> None:
    """Ray's `worker_process_setup_hook`: install the extension in the worker before any actor code runs."""
    install()
    cpu_checks.worker_started()


def runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """Ray's ``RAY_RUNTIME_ENV_HOOK``: `ray.init`'s runtime env with `setup_worker` as the worker setup hook."""
    env = dict(runtime_env or {})
    env.setdefault("worker_process_setup_hook", SETUP_HOOK)
    return env


# ── what install() puts in OpenRLHF ──


def _process_response_into_experience(self: Any, response: dict[str, Any], **kwargs: Any) -> Any:
    """OpenRLHF's method for the episode's (last) segment; the earlier segments made by the same method and kept
    on it, in order, with the over-long flag."""
    original = _ORIGINAL[f"{_SAMPLES}:SamplesGenerator._process_response_into_experience"]
    experience = original(self, response, **kwargs)
    earlier = response.get(SEGMENTS_KEY) or []
    if earlier:
        setattr(experience, _SEGMENTS_ATTR, [original(self, segment, **kwargs) for segment in earlier])
    if response.get(OVERLONG_KEY):
        setattr(experience, _OVERLONG_ATTR, True)
    return experience


def _make_experience_batch(self: Any, rollout_samples: list[Any]) -> list[Any]:
    """`RemoteExperienceMaker.make_experience_batch` over segments: one sample per segment, advantages per episode."""
    episodes = list(rollout_samples)
    masking = mask_overlong()
    flat: list[Any] = []
    owners: list[int] = []
    for position, episode in enumerate(episodes):
        for sample in (*getattr(episode, _SEGMENTS_ATTR, ()), episode):
            flat.append(sample)
            owners.append(position)
    overlong = [masking and bool(getattr(episode, _OVERLONG_ATTR, False)) for episode in episodes]
    cpu_checks.samples_made(len(episodes), len(flat))
    if len(flat) == len(episodes) and not any(overlong):
        return _ORIGINAL[f"{_MAKER}:RemoteExperienceMaker.make_experience_batch"](self, episodes)  # type: ignore[no-any-return]
    experiences = self.make_experience(self.split_rollout_samples(flat))
    return episode_advantages(self, experiences, episodes, owners, overlong)


@contextlib.contextmanager
def _compute_reward_sees(hook: Callable[[Any, Any], Any]) -> Iterator[None]:
    """While inside, the experience maker's `compute_reward(r, kl_coef, kl, ...)` gets ``hook(r, kl)`` as `r`."""
    module: Any = importlib.import_module(_MAKER)
    real = module.compute_reward

    def compute_reward(r: Any, kl_coef: float, kl: Any, action_mask: Any = None, reward_clip_range: Any = None) -> Any:
        return real(hook(r, kl), kl_coef, kl, action_mask=action_mask, reward_clip_range=reward_clip_range)

    module.compute_reward = compute_reward
    try:
        yield
    finally:
        module.compute_reward = real


def _stand_in(episode: Any, position: int) -> Any:
    """One episode for the episode-level pass: its reward, length and truncation, one action token, no KL."""
    import torch
    from openrlhf.trainer.ppo_utils.experience import Experience

    if episode.rewards is None:
        raise SegmentExtensionError(
            "a compacted or over-long episode came without a reward: the segment extension needs the agent "
            "executor's episode reward (no reward model)"
        )
    info = {"reward": episode.rewards.clone()} if "reward" in episode.info else {}
    return Experience(
        action_mask=torch.ones((1, 1), dtype=torch.long),
        kl=torch.zeros((1, 1)),
        values=torch.zeros((1, 1)),
        rewards=episode.rewards.clone(),
        response_length=episode.response_length,
        truncated=episode.truncated,
        index=[position],
        info=info,
    )


def episode_advantages(
    maker: Any, experiences: list[Any], episodes: Sequence[Any], owners: Sequence[int], overlong: Sequence[bool]
) -> list[Any]:
    """OpenRLHF's advantages for `experiences` (micro-batches of segment samples whose `index` is their position
    in the flat list, `owners[position]` their episode) computed at the episode level; see the module docstring.
    `overlong[episode]` masks that episode's samples."""
    import torch

    args = maker.strategy.args
    group_size = args.rollout.n_samples_per_prompt

    # episode level: OpenRLHF's shaping (penalties, group baselines) over one stand-in per episode
    stand_ins = [_stand_in(episode, position) for position, episode in enumerate(episodes)]
    shaped: list[Any] = []
    calls = iter(stand_ins)

    def keep(r: Any, kl: Any) -> Any:
        if kl is not next(calls).kl:
            raise SegmentExtensionError("compute_advantages_and_returns no longer scores its experiences in order")
        shaped.append(r.detach().clone())
        return r

    with _compute_reward_sees(keep):
        maker.compute_advantages_and_returns(stand_ins)
    episode_reward = torch.cat(shaped).float()
    penalized = torch.cat([s.rewards for s in stand_ins])
    stds = torch.cat([s.info["group_reward_std"] for s in stand_ins]) if group_size > 1 else None

    # segment level: OpenRLHF's per-token part over every segment, each given its episode's shaped reward
    rows = [torch.tensor([owners[i] for i in experience.index], dtype=torch.long) for experience in experiences]
    flags = torch.tensor(list(overlong), dtype=torch.bool)
    masks = []
    for experience, owner in zip(experiences, rows, strict=True):
        masks.append(experience.action_mask)
        if flags[owner].any():
            experience.action_mask = experience.action_mask.clone()
            experience.action_mask[flags[owner]] = 0
    pending = iter(zip(experiences, rows, strict=True))

    def substitute(r: Any, kl: Any) -> Any:
        experience, owner = next(pending)
        if kl is not experience.kl:
            raise SegmentExtensionError("compute_advantages_and_returns no longer scores its experiences in order")
        return episode_reward[owner].to(r.dtype)

    args.rollout.n_samples_per_prompt = sum(len(row) for row in rows)  # one group: its shaping is replaced anyway
    try:
        with _compute_reward_sees(substitute):
            experiences = maker.compute_advantages_and_returns(experiences)
    finally:
        args.rollout.n_samples_per_prompt = group_size

    for experience, owner, mask in zip(experiences, rows, masks, strict=True):
        experience.action_mask = mask
        masked = flags[owner]
        if masked.any():
            experience.advantages[masked] = 0.0
            experience.returns[masked] = 0.0
        experience.rewards = penalized[owner].clone()
        if "reward" in experience.info:
            experience.info["reward"] = penalized[owner].clone()
        if stds is not None:
            experience.info["group_reward_std"] = stds[owner].clone()
        else:
            experience.info.pop("group_reward_std", None)
    if cpu_checks.enabled():
        cpu_checks.advantages_spread(_episode_spread(experiences, rows), str(args.algo.advantage.estimator))
    return experiences


def _episode_spread(experiences: Sequence[Any], rows: Sequence[Any]) -> float:
    """The largest difference between two trained tokens' advantages within one episode (0 when every segment
    carries the episode's advantage on every token)."""
    import torch

    low: dict[int, float] = {}
    high: dict[int, float] = {}
    for experience, owner in zip(experiences, rows, strict=True):
        mask = experience.action_mask.bool()
        for sample, episode in enumerate(owner.tolist()):
            values = experience.advantages[sample][mask[sample]]
            if values.numel():
                low[episode] = min(low.get(episode, float("inf")), float(torch.min(values)))
                high[episode] = max(high.get(episode, float("-inf")), float(torch.max(values)))
    return max((high[e] - low[e] for e in low), default=0.0)
