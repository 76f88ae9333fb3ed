"""The local trainer, end to end and for real: the ``ci`` preset trains the demo agent from nothing (tokenizer,
model, SFT on expert episodes, RL through the OpenRLHF executor on the `hf` engine) and must measurably learn on
held-out problems; a paused run resumes to the same end; the run directory holds what the README promises; and
`apps/serve` with no --model serves the installed result, answering as the trainer's own evaluation does.

These are outcome checks on a shortened run (the ``ci`` preset: 200 SFT steps, 20 RL steps, 100 held-out
problems; about five minutes on two idle cores) at a fixed seed. A run is reproducible on one machine (the same
seed gave the same figures in separate sessions), not across seeds. Measured with this preset (RL evaluations
every 5 steps in brackets):

    seed 0: before 0.00, after SFT 0.63, after RL 0.76 (0.75 0.75 0.73 0.76)
    seed 1: before 0.00, after SFT 0.54, after RL 0.67 (0.60 0.55 0.56 0.67)
    seed 2: before 0.00, after SFT 0.50, after RL 0.80 (0.54 0.57 0.68 0.80)
    seed 3: before 0.00, after SFT 0.46, after RL 0.46 (0.47 0.45 0.48 0.46)

The SFT margin holds for every seed tried; the RL margin is asserted for seed 0, where every RL evaluation was at
least 0.10 above the SFT figure. At seed 3 twenty RL steps were not enough (most failures miscopy the tool's
result into the answer). The full run's figures are in the package README."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

pytest.importorskip("torch")
pytest.importorskip("vllm")

from agent_train.local.config import LocalTrainConfig, preset
from agent_train.local.metrics import read_metrics
from agent_train.local.trainer import TrainResult, train_local
from tests.support.tiny_demo import TINY_DEMO_SPEC

SEED = 0
MIN_SFT_GAIN = 0.25  # measured: 0.63 / 0.54 / 0.50 / 0.46 over seeds 0 / 1 / 2 / 3
MIN_RL_GAIN = 0.08  # measured at seed 0: +0.13 at the end, at least +0.10 at every RL evaluation


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    config = msgspec.structs.replace(preset("ci"), seed=SEED)
    return train_local(config, tmp_path_factory.mktemp("ci-run"), progress=False)


def test_the_ci_run_learns_in_both_phases(ci_run: TrainResult) -> None:
    figures = ci_run.figures
    assert set(figures) == {"before", "after_sft", "after_rl"}
    assert figures["before"] <= 0.02  # an untrained model cannot do this
    assert figures["after_sft"] >= figures["before"] + MIN_SFT_GAIN
    assert figures["after_rl"] >= figures["after_sft"] + MIN_RL_GAIN
    assert ci_run.eval_episodes == preset("ci").eval_size and ci_run.finished


def test_the_run_directory_holds_metrics_plot_summary_and_a_servable_model(ci_run: TrainResult) -> None:
    import asyncio

    from agent_runtime.engines.hf import HFEngine
    from agent_train.demo.recipe import make_recipe
    from agent_train.local.evaluate import evaluate

    config = preset("ci")
    records = read_metrics(ci_run.files["metrics"])
    assert [r["step"] for r in records if r["kind"] == "sft"] == list(range(1, config.sft_steps + 1))
    rl_steps = [r["step"] for r in records if r["kind"] == "rl"]
    assert rl_steps == list(range(config.sft_steps + 1, config.sft_steps + config.rl_steps + 1))
    labels = [r["label"] for r in records if r["kind"] == "eval" and r["label"]]
    assert labels == ["before", "after_sft", "after_rl"]
    assert ci_run.files["plot"].read_bytes()[:4] == b"\x89PNG"
    summary = json.loads(ci_run.files["summary"].read_text())
    assert summary["figures"] == ci_run.figures and summary["seed"] == config.seed and summary["finished"]

    # the final model directory is a checkpoint the serving engine loads, and it scores what training measured
    recipe = make_recipe()
    engine = HFEngine.from_pretrained(ci_run.model_dir)
    result, _ = asyncio.run(evaluate(engine, recipe, list(recipe.rows("test"))[: config.eval_size]))
    asyncio.run(engine.close())
    assert abs(result.success - ci_run.figures["after_rl"]) <= 0.03  # batching may flip a near-tie or two


def test_a_paused_run_resumes_where_it_stopped(tmp_path: Path) -> None:
    tiny = TINY_DEMO_SPEC
    config = msgspec.structs.replace(
        LocalTrainConfig(),
        model=tiny,
        tokenizer_episodes=300,
        sft_episodes=40,
        sft_steps=4,
        sft_batch_size=4,
        rl_steps=4,
        rl_prompts=2,
        rl_group_size=2,
        rl_kl_coef=0.01,  # the reference model is the saved SFT model, loaded again after the resume
        eval_size=4,
        eval_every=2,
        checkpoint_every=2,
    )
    paused = train_local(config, tmp_path, progress=False, stop_after=5)
    assert not paused.finished and set(paused.figures) == {"before", "after_sft"}
    assert not (tmp_path / "final").exists() and (tmp_path / "sft").is_dir()
    with pytest.raises(Exception, match="different configuration"):
        train_local(msgspec.structs.replace(config, seed=1), tmp_path, progress=False, resume=True)
    done = train_local(config, tmp_path, progress=False, resume=True)
    assert done.finished and set(done.figures) == {"before", "after_sft", "after_rl"}
    steps = [(r["kind"], r["step"]) for r in read_metrics(done.files["metrics"]) if r["kind"] != "eval"]
    assert steps == [("sft", s) for s in range(1, 5)] + [("rl", s) for s in range(5, 9)]  # no gap, no repeat
    assert (tmp_path / "final" / "model.safetensors").is_file()
    again = train_local(config, tmp_path, progress=False, resume=True)  # a finished run has nothing left to do
    assert again.finished and again.figures == done.figures


def test_apps_serve_with_no_model_serves_the_installed_demo_model_as_training_ran_it(
    ci_run: TrainResult, tmp_path: Path
) -> None:
    """`uv run apps/serve` with no --model finds the demo model in its cache (installed from this run, as
    `uv run apps/train` installs it) and answers through the OpenAI API exactly as the trainer's own greedy
    evaluation of the same model does: same session, protocol, parser and weights, so the same answer."""
    import asyncio

    from openai import OpenAI

    from agent_runtime.engines.hf import HFEngine
    from agent_train.demo.build import install_demo_model
    from agent_train.demo.recipe import make_recipe
    from agent_train.local.evaluate import evaluate
    from tests.support.serve_process import ServeProcess, free_port

    home = tmp_path / "agent-home"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OPENRLHF_AGENT_HOME", str(home))
        install_demo_model(ci_run.model_dir, summary=ci_run.files["summary"])
    recipe = make_recipe()
    rows = list(recipe.rows("test"))[:8]

    async def one_at_a_time() -> list[str | None]:  # batch size 1, as the server below runs them
        engine = HFEngine.from_pretrained(ci_run.model_dir)
        try:
            return [(await evaluate(engine, recipe, [row]))[1][0].final_answer for row in rows]
        finally:
            await engine.close()

    expected = asyncio.run(one_at_a_time())
    port = free_port()
    with ServeProcess(["--port", str(port)], env={"OPENRLHF_AGENT_HOME": str(home)}) as app:
        assert app.url == f"http://127.0.0.1:{port}"
        client = OpenAI(base_url=f"{app.url}/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [recipe.name]
        served = []
        for row in rows:
            completion = client.chat.completions.create(
                model=recipe.name, messages=[{"role": "user", "content": row["prompt"]}]
            )
            served.append(completion.choices[0].message.content)
        stream = client.chat.completions.create(
            model=recipe.name, messages=[{"role": "user", "content": rows[0]["prompt"]}], stream=True
        )
        events = [e for chunk in stream if (e := (chunk.model_extra or {}).get("agent_event")) is not None]
    assert app.returncode == 0, app.stderr[-3000:]
    assert served == expected
    assert sum(answer == f"The answer is {row['answer']}." for answer, row in zip(served, rows, strict=True)) >= 2
    calls = [e["call"] for e in events if e["type"] == "tool_call"]
    assert calls and calls[0]["name"] == "calculator", events
