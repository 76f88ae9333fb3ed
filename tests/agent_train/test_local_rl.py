"""The local trainer's RL math: group advantages (GRPO and REINFORCE++-baseline), the token-level clipped
policy-gradient loss with its KL term, batches aligned on targets, and OpenRLHF's action ranges as loss masks."""

from __future__ import annotations

import itertools
import math
import random

import pytest

torch = pytest.importorskip("torch")

from agent_train.local.batch import pad_batch, token_logprobs, values_on_targets  # noqa: E402
from agent_train.local.rl import group_advantages, policy_loss, rl_update  # noqa: E402
from agent_train.local.rollout import RolloutRecord  # noqa: E402
from tests.support.loss_masks import loss_mask_from_ranges  # noqa: E402


def test_grpo_normalizes_within_each_group() -> None:
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    advantages = group_advantages(rewards, groups, "grpo")
    std = math.sqrt(sum((r - 0.25) ** 2 for r in rewards[:4]) / 3)
    assert advantages[0] == pytest.approx(0.75 / std, rel=1e-4)
    assert advantages[1] == pytest.approx(-0.25 / std, rel=1e-4)
    assert advantages[4:] == [0.0] * 4  # a group that all scored the same carries no signal
    assert sum(advantages[:4]) == pytest.approx(0.0, abs=1e-6)


def test_reinforce_baseline_subtracts_the_group_mean_and_scales_by_the_batch() -> None:
    rewards = [1.0, 0.0, 0.5, 0.5]
    advantages = group_advantages(rewards, [0, 0, 1, 1], "reinforce_baseline")
    centered = [0.5, -0.5, 0.0, 0.0]
    scale = math.sqrt(sum(c * c for c in centered) / 4)  # OpenRLHF's whitening: the population std over tokens
    assert advantages == pytest.approx([c / scale for c in centered], rel=1e-4)
    with pytest.raises(ValueError, match="estimator"):
        group_advantages(rewards, [0, 0, 1, 1], "ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group ids"):
        group_advantages(rewards, [0], "grpo")


def test_action_ranges_become_a_loss_mask() -> None:
    assert loss_mask_from_ranges(8, [(2, 4), (6, 8)]) == [0, 0, 1, 1, 0, 0, 1, 1]
    assert loss_mask_from_ranges(3, []) == [0, 0, 0]
    with pytest.raises(ValueError, match="outside"):
        loss_mask_from_ranges(3, [(2, 5)])


def _tiny_model() -> object:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    return Qwen3ForCausalLM(config)


def test_batches_align_logprobs_and_masks_on_targets() -> None:
    model = _tiny_model()
    batch = pad_batch([[1, 2, 3, 4], [5, 6]], [[0, 0, 1, 1], [0, 1]], pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    assert batch.target_mask.tolist() == [[0, 1, 1], [1, 0, 0]]
    logprobs = token_logprobs(model, batch)
    with torch.no_grad():
        alone = torch.log_softmax(model(input_ids=torch.tensor([[5, 6]])).logits[0, 0].float(), -1)[6]  # type: ignore[operator]
    assert float(logprobs[1, 0].detach()) == pytest.approx(
        float(alone), abs=1e-5
    )  # right padding changes nothing before it
    assert values_on_targets([[0.0, 0.0, -1.0, -2.0], [0.0, -3.0]], 4).tolist() == [[0, -1, -2], [-3, 0, 0]]
    with pytest.raises(ValueError, match="mask values"):
        pad_batch([[1, 2]], [[1]], pad_id=0)


def test_logprobs_on_targets_only_equal_the_full_head_and_give_the_same_gradients() -> None:
    """A plain-head model projects only the trained positions onto the vocabulary: the same logprobs there, 0
    elsewhere, and the same loss gradient as projecting every position."""
    model = _tiny_model()
    rng = random.Random(0)
    ids = [[rng.randrange(1, 32) for _ in range(n)] for n in (9, 5, 12)]
    masks = [[int(rng.random() < 0.4) for _ in seq] for seq in ids]
    batch = pad_batch(ids, masks, pad_id=0)
    mask = batch.target_mask

    class Wrapped(torch.nn.Module):  # not a plain-head class: takes the full path, through the same weights
        def __init__(self, inner: object) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, **kwargs: object) -> object:
            return self.inner(**kwargs)  # type: ignore[operator]

    def run(subject: object) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()  # type: ignore[attr-defined]
        logprobs = token_logprobs(subject, batch, trained_only=True)
        (-(logprobs * mask).sum() / mask.sum()).backward()
        return logprobs.detach(), [p.grad.clone() for p in model.parameters()]  # type: ignore[attr-defined]

    fast, fast_grads = run(model)
    full, full_grads = run(Wrapped(model))
    with torch.no_grad():  # without trained_only, every position, as before
        assert torch.allclose(token_logprobs(model, batch), full, atol=1e-6)
    assert mask.sum() > 0 and (mask == 0).any()
    assert torch.allclose(fast * mask, full * mask, atol=1e-6)
    assert bool((fast[mask == 0] == 0).all()) and bool((full[mask == 0] != 0).any())
    for fast_grad, full_grad in zip(fast_grads, full_grads, strict=True):
        assert torch.allclose(fast_grad, full_grad, atol=1e-6)


def test_policy_loss_is_reinforce_at_ratio_one_and_clips_beyond() -> None:
    logprobs = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = policy_loss(logprobs, logprobs.detach(), torch.tensor([2.0]), mask)
    loss.backward()
    assert float(loss) == pytest.approx(-2.0)
    assert logprobs.grad is not None
    assert logprobs.grad[0].tolist() == pytest.approx([-1.0, -1.0, 0.0])  # -A / tokens, nothing off the mask
    assert stats["clip_frac"] == 0.0
    # a token whose ratio already rose past 1 + eps gets no more push up
    moved = torch.tensor([[-0.5, -2.0, -3.0]], requires_grad=True)
    loss, stats = policy_loss(moved, logprobs.detach(), torch.tensor([1.0]), mask, clip_eps=0.2)
    loss.backward()
    assert moved.grad is not None and moved.grad[0, 0] == 0.0 and moved.grad[0, 1] != 0.0
    assert stats["clip_frac"] == pytest.approx(0.5)


def test_kl_term_is_zero_at_the_reference_and_positive_away_from_it() -> None:
    logprobs = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2)
    _, same = policy_loss(logprobs, logprobs, torch.tensor([0.0]), mask, ref_logprobs=logprobs, kl_coef=0.1)
    assert same["kl"] == pytest.approx(0.0, abs=1e-7)
    _, away = policy_loss(logprobs, logprobs, torch.tensor([0.0]), mask, ref_logprobs=logprobs - 0.5, kl_coef=0.1)
    assert away["kl"] > 0 and away["loss"] == pytest.approx(0.1 * away["kl"], rel=1e-5)


def test_an_rl_update_raises_the_logprob_of_the_rewarded_episode() -> None:
    model = _tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)  # type: ignore[attr-defined]
    good = RolloutRecord(group=0, ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1], logprobs=[0.0] * 4, reward=1.0,
                         truncated=False)  # fmt: skip
    bad = RolloutRecord(group=0, ids=[1, 2, 7, 8], loss_mask=[0, 0, 1, 1], logprobs=[0.0] * 4, reward=0.0,
                        truncated=False)  # fmt: skip
    same = RolloutRecord(group=1, ids=[9, 9, 9], loss_mask=[0, 1, 1], logprobs=[0.0] * 3, reward=1.0, truncated=False)

    def logprob_of(record: RolloutRecord) -> float:
        batch = pad_batch([record.ids], [record.loss_mask], pad_id=0)
        with torch.no_grad():
            return float((token_logprobs(model, batch) * batch.target_mask).sum())

    records = [good, bad, same, same]
    advantages = group_advantages([r.reward for r in records], [r.group for r in records], "grpo")
    # the rollout's own logprobs make the ratio exactly 1 on the first minibatch
    records = [
        RolloutRecord(group=r.group, ids=r.ids, loss_mask=r.loss_mask, reward=r.reward, truncated=False,
                      logprobs=[0.0, *token_logprobs(model, pad_batch([r.ids], [r.loss_mask], pad_id=0))[0].tolist()])
        for r in records
    ]  # fmt: skip
    before_good, before_bad = logprob_of(good), logprob_of(bad)
    stats = rl_update(model, optimizer, records, advantages, pad_id=0, rng=random.Random(0))
    assert stats["samples"] == 2.0  # the all-equal group was dropped
    assert stats["tokens"] == 4.0
    assert logprob_of(good) > before_good and logprob_of(bad) < before_bad
    assert rl_update(model, optimizer, records[2:], [0.0, 0.0], pad_id=0) == {"samples": 0.0, "tokens": 0.0}


def test_the_sft_learning_rate_warms_up_then_stays_or_decays_to_its_floor() -> None:
    from agent_train.local.config import LocalTrainConfig
    from agent_train.local.trainer import sft_learning_rate

    constant = LocalTrainConfig(sft_lr=1e-3, sft_warmup_steps=10, sft_steps=100)
    assert sft_learning_rate(constant, 0) == pytest.approx(1e-4)
    assert [sft_learning_rate(constant, s) for s in (9, 50, 99)] == [pytest.approx(1e-3)] * 3
    cosine = LocalTrainConfig(sft_lr=1e-3, sft_warmup_steps=10, sft_steps=100, sft_final_lr_ratio=0.1)
    assert sft_learning_rate(cosine, 0) == pytest.approx(1e-4)
    assert sft_learning_rate(cosine, 10) == pytest.approx(1e-3)
    assert sft_learning_rate(cosine, 99) == pytest.approx(1e-4)
    rates = [sft_learning_rate(cosine, s) for s in range(10, 100)]
    assert all(a >= b for a, b in itertools.pairwise(rates))  # never rises after the warmup
