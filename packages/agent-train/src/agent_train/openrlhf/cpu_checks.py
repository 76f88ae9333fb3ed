"""What a ``--device cpu`` run proves, step by step: the checks its processes record and the verdict on them.

Each process of the job appends one JSON line per event to the file ``AGENT_OPENRLHF_CHECKS`` names (`CHECKS_ENV`;
`main` sets it to ``RUN_DIR/cpu_checks.jsonl``); lines are short and written with ``O_APPEND``, so
processes do not interleave within a line:

- ``worker``: a Ray worker started, with whether the segment extension and the CPU bridges are installed in it;
- ``sent``: the actor's rank 0 broadcast a sync (its index, the parameter count and a digest of every byte sent);
- ``loaded``: a vLLM worker received a sync and loaded it (the digest of what it received; whether its model's
  parameters changed; how many received tensors its model holds as they were sent, and how many of those are
  equal after the load: vLLM keeps embeddings and norms as sent, and repacks the linear layers);
- ``train``: one training step of the actor: the vLLM-vs-actor logprob gap on the step's sampled tokens (vLLM's
  logprob of each sampled token against the actor's, before the update, on the weights vLLM sampled with), the
  mean absolute advantage and the number of samples;
- ``samples``: the experience maker made S training samples from E episodes (S > E when episodes compacted);
- ``advantages``: for a batch with compacted episodes, the largest difference between two trained tokens'
  advantages within one episode (0 under the group estimators: every segment carries its episode's advantage);
- ``version``: a vLLM rollout actor loaded a sync and bumped its policy version (`engine_versions`), with how
  many requests had part of their tokens sampled when generation paused for it.

`verdict(path)` reads the file and says, per check, whether it held. With nothing set, every function here is a
no-op. Torch is imported inside the functions only.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

__all__ = [
    "CHECKS_ENV",
    "EPISODE_ADVANTAGE_ESTIMATORS",
    "MAX_LOGPROB_GAP",
    "CheckReport",
    "advantages_spread",
    "enabled",
    "install",
    "model_digest",
    "record",
    "samples_made",
    "verdict",
    "weight_sent",
    "weights_loaded",
    "worker_started",
]

CHECKS_ENV: Final = "AGENT_OPENRLHF_CHECKS"
MAX_LOGPROB_GAP: Final = 1e-3
"""The bound on the mean vLLM-vs-actor logprob gap (k3 estimate of KL(vLLM || actor), per token) of a step. Both
run the model in bf16 with different kernels, so they differ by rounding: on the demo models the worst step of a
run measured 0.5e-4 to 2.1e-4 (GRPO, PPO, async, 3 to 20 steps); with the sync's load made a no-op, vLLM sampling
with stale weights, step 3 of a run at learning rate 1e-4 measured 1.4e-3."""

EPISODE_ADVANTAGE_ESTIMATORS: Final = frozenset({"group_norm", "dr_grpo", "rloo", "reinforce_baseline"})
"""The estimators whose advantage is one number per episode (no per-token returns), checked as such."""

_SYNC: dict[str, Any] = {"index": 0, "hash": None, "count": 0}
_STEP: dict[str, Any] = {}


def enabled() -> bool:
    return bool(os.environ.get(CHECKS_ENV, "").strip())


def record(kind: str, **fields: Any) -> None:
    """Append one check to the file ``AGENT_OPENRLHF_CHECKS`` names (nothing when it is unset)."""
    path = os.environ.get(CHECKS_ENV, "").strip()
    if not path:
        return
    line = json.dumps({"kind": kind, "pid": os.getpid(), "time": round(time.time(), 3), **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _tensor_bytes(tensor: Any) -> bytes:
    import torch

    flat = tensor.detach().contiguous().cpu().reshape(-1)
    if flat.dtype in (torch.bfloat16, torch.float16):
        flat = flat.view(torch.int16)
    return bytes(flat.numpy().tobytes())


def worker_started() -> None:
    """Record a Ray worker's start, with what is installed in it."""
    if not enabled():
        return
    from agent_train.openrlhf import cpu_bridges, segments

    record("worker", segments=segments.installed(), cpu=cpu_bridges.installed())


def weight_sent(tensor: Any) -> None:
    """The actor's rank 0 is broadcasting `tensor` as part of the current sync."""
    if not enabled() or _SYNC["hash"] is None:
        return
    _SYNC["hash"].update(_tensor_bytes(tensor))
    _SYNC["count"] += 1


def model_digest(model: Any) -> str:
    """A digest of every parameter of vLLM's model, in its own layout."""
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        digest.update(name.encode())
        digest.update(_tensor_bytes(parameter))
    return digest.hexdigest()[:16]


def weights_loaded(model: Any, weights: Sequence[tuple[str, Any]], before: str) -> None:
    """A vLLM worker loaded one sync's `weights`; `before` is `model_digest` before the load."""
    if not enabled():
        return
    received = hashlib.sha256()
    for _, tensor in weights:
        received.update(_tensor_bytes(tensor))
    own = dict(model.named_parameters())
    comparable = [(own[name], tensor) for name, tensor in weights if name in own and own[name].shape == tensor.shape]
    equal = sum(bool((kept.detach().to(tensor.dtype) == tensor).all()) for kept, tensor in comparable)
    record(
        "loaded",
        received=received.hexdigest()[:16],
        params=len(weights),
        changed=model_digest(model) != before,
        comparable=len(comparable),
        equal=equal,
    )


def samples_made(episodes: int, samples: int) -> None:
    """The experience maker made `samples` training samples from `episodes` episodes."""
    record("samples", episodes=episodes, samples=samples)


def advantages_spread(spread: float, estimator: str) -> None:
    """The segment extension gave a batch's compacted episodes their advantages: `spread` is the largest
    difference between two trained tokens' advantages within one episode."""
    record("advantages", spread=spread, estimator=estimator)


# ── hooks on OpenRLHF's actor ──


def _broadcast_to_vllm(real: Any) -> Any:
    def broadcast_to_vllm(self: Any) -> Any:
        _SYNC.update(hash=hashlib.sha256(), count=0)
        try:
            return real(self)
        finally:
            if _SYNC["count"]:
                record("sent", sync=_SYNC["index"], params=_SYNC["count"], digest=_SYNC["hash"].hexdigest()[:16])
                _SYNC["index"] += 1
            _SYNC["hash"] = None

    return broadcast_to_vllm


def _ppo_train(real: Any) -> Any:
    def ppo_train(self: Any, *args: Any, **kwargs: Any) -> Any:
        _STEP.clear()
        _STEP.update(gap=0.0, k1=0.0, tokens=0.0, advantage=0.0, samples=0, with_logprobs=0)
        try:
            return real(self, *args, **kwargs)
        finally:
            tokens = max(_STEP["tokens"], 1.0)
            record(
                "train",
                samples=_STEP["samples"],
                with_logprobs=_STEP["with_logprobs"],
                logprob_gap=_STEP["gap"] / tokens,
                logprob_k1=_STEP["k1"] / tokens,
                mean_abs_advantage=_STEP["advantage"] / tokens,
                tokens=int(_STEP["tokens"]),
            )

    return ppo_train


def _training_step(real: Any) -> Any:
    def training_step(self: Any, experience: Any, *args: Any, **kwargs: Any) -> Any:
        if _STEP:
            _observe(experience)
        return real(self, experience, *args, **kwargs)

    return training_step


def _observe(experience: Any) -> None:
    import torch

    mask = experience.action_mask.float()
    _STEP["samples"] += int(mask.shape[0])
    _STEP["advantage"] += float((experience.advantages.abs() * mask).sum())
    rollout = experience.rollout_log_probs
    if rollout is None:
        _STEP["tokens"] += float(mask.sum())
        return
    _STEP["with_logprobs"] += int(mask.shape[0])
    log_ratio = (experience.action_log_probs - rollout).float()  # log pi_actor - log pi_vllm on vLLM's samples
    k3 = torch.expm1(log_ratio) - log_ratio  # >= 0, an unbiased estimate of KL(vLLM || actor)
    _STEP["gap"] += float((k3 * mask).sum())
    _STEP["k1"] += float((-log_ratio * mask).sum())
    _STEP["tokens"] += float(mask.sum())


def install() -> None:
    """Hook the actor's sync and training step (in every process; they act where the actor runs)."""
    module: Any = __import__("openrlhf.trainer.ray.ppo_actor", fromlist=["ActorPPOTrainer"])
    trainer = module.ActorPPOTrainer
    trainer.broadcast_to_vllm = _broadcast_to_vllm(trainer.broadcast_to_vllm)
    trainer.ppo_train = _ppo_train(trainer.ppo_train)
    trainer.training_step = _training_step(trainer.training_step)


# ── the verdict ──


class CheckReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a run's checks file shows. `problems` is empty when every check held."""

    steps: int
    syncs: int
    engines: int
    max_logprob_gap: float | None
    mean_abs_advantage: list[float]
    samples: int
    episodes: int
    advantage_spread: float | None
    workers: int
    workers_without_segments: int
    problems: list[str]
    on_policy: bool = True

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        gap = "n/a" if self.max_logprob_gap is None else f"{self.max_logprob_gap:.2e}"
        lines = [
            f"steps trained: {self.steps}; weight syncs: {self.syncs} (to {self.engines} vLLM worker(s))",
            f"vLLM-vs-actor logprob gap (KL, per token), worst step: {gap} "
            + (f"(bound {MAX_LOGPROB_GAP})" if self.on_policy else "(async: older weights sampled, not bounded)"),
            f"episodes -> training samples: {self.episodes} -> {self.samples}"
            + (
                ""
                if self.advantage_spread is None
                else f" (advantage spread within an episode: {self.advantage_spread:.1e})"
            ),
            f"Ray workers: {self.workers}, without the segment extension: {self.workers_without_segments}",
        ]
        lines += [f"FAILED: {problem}" for problem in self.problems] or ["every check held"]
        return "\n".join(lines)


def _read(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def verdict(path: str | os.PathLike[str], *, min_steps: int = 1, on_policy: bool = True) -> CheckReport:
    """Read the checks file at `path` and judge it (see the module docstring). `on_policy` False (async mode):
    a step trains on rollouts that older weights sampled (the IS correction's case), so the vLLM-vs-actor gap is
    reported but not bounded."""
    rows = _read(Path(path)) if Path(path).exists() else []
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], []).append(row)
    problems: list[str] = []
    train, sent, loaded = by_kind.get("train", []), by_kind.get("sent", []), by_kind.get("loaded", [])
    workers = by_kind.get("worker", [])
    if len(train) < min_steps:
        problems.append(f"{len(train)} training step(s) recorded, expected at least {min_steps}")
    engines = len({row["pid"] for row in loaded})
    if not sent:
        problems.append("no weight sync was sent")
    if sent and len(loaded) != len(sent) * max(engines, 1):
        problems.append(f"{len(sent)} sync(s) sent but {len(loaded)} load(s) recorded by {engines} vLLM worker(s)")
    digests = {row["sync"]: row["digest"] for row in sent}
    for index, row in enumerate(loaded):
        sync = index // max(engines, 1)
        if row["received"] != digests.get(sync, row["received"]):
            problems.append(f"sync {sync}: vLLM received other bytes than the actor sent")
        # a sync must change vLLM's weights when the actor's changed since the last one; the first sync sends the
        # weights vLLM started with when the first step did not move the actor (OpenRLHF's warmup starts the
        # learning rate at 0; or every group scored alike)
        if sync > 0 and digests.get(sync) != digests.get(sync - 1) and not row["changed"]:
            problems.append(f"sync {sync}: the actor's weights changed but vLLM's did not when it loaded them")
        if row["equal"] != row["comparable"]:
            problems.append(
                f"sync {sync}: {row['comparable'] - row['equal']} of {row['comparable']} tensors vLLM keeps as sent "
                "differ from the actor's after the load"
            )
    if len(digests) > 1 and len(set(digests.values())) == 1:
        problems.append("every sync sent the same weights: no step changed the actor")
    versions: dict[int, list[dict[str, Any]]] = {}  # each rollout actor's version bumps (`engine_versions`)
    for row in by_kind.get("version", []):
        versions.setdefault(row["pid"], []).append(row)
    for bumps in versions.values():
        if [row["version"] for row in bumps] != list(range(1, len(sent) + 1)):
            problems.append(
                f"a rollout actor's policy versions went {[row['version'] for row in bumps]} over {len(sent)} sync(s)"
            )
        if not all(row["drained"] for row in bumps):
            problems.append("a version bump did not wait for the outputs sampled before it: tokens may be mis-tagged")
    gaps = [row["logprob_gap"] for row in train if row["with_logprobs"]]
    if train and not gaps:
        problems.append("no step had vLLM's logprobs to compare with the actor's")
    worst = max(gaps) if gaps else None
    if on_policy and worst is not None and worst > MAX_LOGPROB_GAP:
        problems.append(f"the vLLM-vs-actor logprob gap reached {worst:.2e}, above {MAX_LOGPROB_GAP}")
    advantages = [row["mean_abs_advantage"] for row in train]
    if train and not any(a > 0 for a in advantages):
        problems.append("every advantage was 0: no step had a gradient (rewards never varied within a group)")
    missing = [row for row in workers if not row["segments"]]
    if missing:
        problems.append(f"{len(missing)} Ray worker(s) ran without the segment extension")
    made = by_kind.get("samples", [])
    spreads = by_kind.get("advantages", [])
    for row in spreads:
        if row["estimator"] in EPISODE_ADVANTAGE_ESTIMATORS and row["spread"] > 1e-5:
            problems.append(
                f"a compacted episode's segments got different advantages (spread {row['spread']:.2e}) under "
                f"{row['estimator']}, whose advantage is one number per episode"
            )
    return CheckReport(
        steps=len(train),
        syncs=len(sent),
        engines=engines,
        max_logprob_gap=worst,
        mean_abs_advantage=advantages,
        samples=sum(row["samples"] for row in made),
        episodes=sum(row["episodes"] for row in made),
        advantage_spread=max((row["spread"] for row in spreads), default=None),
        workers=len(workers),
        workers_without_segments=len(missing),
        problems=problems,
        on_policy=on_policy,
    )
