"""`uv run apps/serve`: serve a trained agent behind an OpenAI-compatible API and a web chat page.

With no arguments it serves the project's demo agent (`agent_demo`; its model built first if missing) on
http://127.0.0.1:8000. A model named without a recipe is served with a recipe derived from its directory
(`agent_runtime.model_recipe`). This file only parses arguments, configures logging, builds the engine and the
recipe, and starts uvicorn; the server is `agent_runtime.serving`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
import uvicorn

from agent_demo import make_recipe as demo_recipe
from agent_demo import running_total_recipe
from agent_protocol import HFTokenizer, Tokenizer, TokenizerLoadError, list_protocols
from agent_runtime import (
    LLMEngine,
    Recipe,
    RecipeError,
    RuntimeAgentError,
    ignore_pynvml_deprecation,
    load_recipe,
    recipe_for_model,
)
from agent_runtime.engines import make_engine
from agent_runtime.serving import (
    RayServeMissing,
    ServeConfig,
    ServeConfigError,
    StoreUnavailable,
    TrajectoryFilesError,
    check_store,
    create_app,
    create_viewer_app,
    require_ray_serve,
)

if TYPE_CHECKING:
    from agent_runtime.proxy import ProgramEpisodes

# A model id (not a directory) without --recipe: the files its recipe is derived from, fetched from the Hub cache.
MODEL_CONFIG_FILES = ["config.json", "generation_config.json", "tokenizer_config.json", "chat_template.*"]
API_KEY_ENV = "AGENT_SERVE_API_KEY"

logger = structlog.get_logger("apps.serve")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="uv run apps/serve",
        description=(
            "Serve a tool-using agent: POST /v1/chat/completions (OpenAI-compatible; without `tools` the server runs "
            "the whole episode with the recipe's tools, with `tools` it returns tool calls for the client to run), "
            "GET /v1/models, GET /health, GET /metrics, and a web chat page at /. `--trajectories PATH` without "
            "--model opens a training run's or a server's trajectory logs in the viewer, with no model loaded."
        ),
    )
    parser.add_argument(
        "--model",
        help="a Hugging Face model directory or model id. Omitted: the project's demo agent (agent_demo), its model "
        "built first if missing (agent_train.demo). With --engine openai: the local directory whose tokenizer the "
        "remote model uses.",
    )
    parser.add_argument(
        "--demo",
        choices=("calculator", "compaction"),
        default="calculator",
        help="without --model: which demo agent to serve: calculator (default) or compaction (a running total "
        "carried through summaries; compaction events show on the web page), its model built first if missing",
    )
    parser.add_argument(
        "--engine",
        choices=("hf", "vllm", "openai"),
        default="hf",
        help="the model backend: hf (transformers, CPU or GPU, in process), vllm (in-process vLLM, needs the "
        "agent-runtime[vllm] extra and a GPU) or openai (an OpenAI-compatible completions server that takes and "
        "returns token ids, e.g. `vllm serve`, at --engine-url; default: %(default)s)",
    )
    parser.add_argument(
        "--engine-url",
        "--base-url",
        action="append",
        help="base URL of the completions server for --engine openai, e.g. http://gpu:8001/v1; repeat it (or give a "
        "comma list) for several replicas of the model: each episode's turns stay on one (session affinity)",
    )
    parser.add_argument(
        "--session-header",
        default="X-Session-ID",
        help="the header that carries each episode's session key to the --engine-url server(s), for a router in "
        "front that keeps affinity itself; empty: none (default: %(default)s)",
    )
    parser.add_argument(
        "--engine-model", help="the model name the --engine-url server knows (default: the value of --model)"
    )
    parser.add_argument(
        "--context-length",
        type=int,
        help="the model's context in tokens (default: the model's max_position_embeddings; 32768 for --engine openai "
        "if unknown). Without --recipe it is also the derived recipe's context",
    )
    parser.add_argument(
        "--device", default="cpu", help="device of the hf engine: cpu, cuda, cuda:1, ... (default: %(default)s)"
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        metavar="POSITIONS",
        help="hf engine: the most key/value positions one batch's cache may hold, padding included (rows x its longest "
        "row, up to the last token it may generate); a request that would take a batch past it waits for the next "
        "batch, so one long conversation among short ones does not make every row hold its length. Memory is this x "
        "the model's bytes per position (layers x 2 x kv_heads x head_dim x dtype bytes). Default: no bound",
    )
    parser.add_argument(
        "--join-ratio",
        type=float,
        metavar="RATIO",
        help="hf engine: requests that arrive while a batch runs join it once they are RATIO times its rows still "
        "generating (or after --join-wait-steps); each join makes the running rows wait for the newcomers' prefill. "
        "0 with --join-wait-steps 0: every request joins at the next step. Default: 1.0",
    )
    parser.add_argument(
        "--join-wait-steps",
        type=int,
        metavar="STEPS",
        help="hf engine: the most decode steps a request waits to join a running batch before it joins anyway (the "
        "batch ending also ends the wait). Default: 20",
    )
    parser.add_argument(
        "--recipe",
        help="the agent definition: a recipe .py file or a module path (`package.module[:attr]`) defining `recipe` "
        "or `make_recipe()`. Default without --model: the demo recipe (agent_demo.recipe), served only with the demo "
        "model. Default with --model: a recipe derived from the model directory: the chat protocol its chat template "
        f"is (one of {', '.join(list_protocols())}; another family is refused, name a recipe), its "
        "max_position_embeddings as the context, generation_config.json's max_new_tokens and sampling (else 8192 "
        "tokens a turn, at most half the context), no tools in agent mode (tools mode uses the tools the client "
        "sends). A program recipe (one whose `agent` is an AgentProgram, e.g. examples/any_agent/recipe.py) is "
        "served by running its program: each agent-mode request runs it once on the served model, its turns "
        "streamed as agent events and its return value the answer (a command program through one gateway on "
        "loopback, AGENT_GATEWAY_HOST/PORT to change it)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface to listen on; 0.0.0.0 for every interface (default: %(default)s)"
    )
    parser.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default: %(default)s)")
    parser.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help="serve from N Ray Serve replicas behind Ray's HTTP proxy on --host/--port, each building its own engine "
        "and store from these flags (share transcripts with a shared --store); Ray is started here unless "
        "--ray-address names a cluster. Default: one process, no Ray",
    )
    parser.add_argument(
        "--ray-address", metavar="ADDR", help="with --replicas: deploy on this running Ray cluster (e.g. auto)"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"require `Authorization: Bearer KEY` on /v1/* and /metrics (default: ${API_KEY_ENV}; unset: no key)",
    )
    ServeConfig.add_arguments(parser)  # every server limit: its flag, default, bounds and help live there
    parser.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="with --trajectories and no --model: the tokenizer.json (or model directory) that decodes each token of "
        "the records into its piece (default: the --demo model's, when it is built; else tokens show their ids)",
    )
    parser.add_argument(
        "--served-model-name", help="the model id clients send (default: the model directory's name or the model id)"
    )
    parser.add_argument(
        "--log-format",
        choices=("auto", "console", "json"),
        default="auto",
        help="log lines for people (console) or machines (json); auto (default): console on a terminal, else json",
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="the lowest level logged (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.engine == "openai" and not args.engine_url:
        parser.error("--engine openai needs --engine-url")
    if args.engine == "openai" and not args.model:
        parser.error("--engine openai needs --model (a local model directory holding the tokenizer)")
    if args.max_batch_tokens is not None and args.engine != "hf":
        parser.error(f"--max-batch-tokens bounds the hf engine's batches; --engine {args.engine} batches on its own")
    if args.max_batch_tokens is not None and args.max_batch_tokens < 1:
        parser.error("--max-batch-tokens must be at least 1")
    for flag, given in (("--join-ratio", args.join_ratio), ("--join-wait-steps", args.join_wait_steps)):
        if given is not None and args.engine != "hf":
            parser.error(
                f"{flag} sets when the hf engine's batches take requests in; --engine {args.engine} batches on its own"
            )
        if given is not None and (given < 0 or given != given):  # NaN too
            parser.error(f"{flag} must be >= 0")
    if args.replicas is not None and args.replicas < 1:
        parser.error("--replicas must be at least 1")
    if args.ray_address is not None and args.replicas is None:
        parser.error("--ray-address deploys the --replicas on a Ray cluster; give --replicas N")
    if args.replicas is not None and args.trajectories is not None and args.model is None:
        parser.error("--replicas serves a model; the trajectory viewer alone runs in one process")
    if args.trajectories == "":
        parser.error("--trajectories needs a path: a trajectory JSONL file or a directory of them")
    if args.trajectories is not None and args.model is None and not Path(args.trajectories).exists():
        parser.error(f"--trajectories {args.trajectories}: no such file or directory")
    if args.tokenizer is not None and (args.trajectories is None or args.model is not None):
        parser.error("--tokenizer decodes the records of --trajectories without --model (a served model uses its own)")
    try:
        ServeConfig.from_args(args, model_name="checked")
    except ServeConfigError as e:
        parser.error(str(e))
    return args


class _NamedWriteLogger(structlog.WriteLogger):
    """structlog's line writer with the name it was asked for, which `add_logger_name` reads as it reads a standard
    library logger's. A line that cannot be written (stderr full, closed, a broken pipe) is dropped, as the standard
    library's handler drops it: logging never fails a request."""

    def __init__(self, name: str) -> None:
        super().__init__(sys.stderr)
        self.name = name

    def __getstate__(self) -> str:
        # the name only: the process that unpickles it writes to its own stderr
        return self.name

    def __setstate__(self, state: Any) -> None:
        # Ray ships the app (and the loggers its modules cached) to each replica: structlog's own state keeps only
        # the stream, and a replica's logger without its name failed at its first event.
        self.__init__(str(state))  # type: ignore[misc]

    def msg(self, message: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            super().msg(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _json_line(event: dict[str, Any], **dumps_kw: Any) -> str:
    """A JSON log line by msgspec: the same keys and order as `json.dumps`, compact, and non-ASCII text as UTF-8;
    about 5 us less a line (some 1% of an agent request's server CPU; a plain one logs one line, a streamed one
    two). An event holding what msgspec cannot encode (an object without a JSON form) goes to `json.dumps` with
    structlog's fallback, as before."""
    try:  # msgspec's module function, not an Encoder object: Ray pickles this module's functions (--replicas)
        return msgspec.json.encode(event).decode()
    except (TypeError, OverflowError, ValueError):
        return json.dumps(event, **dumps_kw)


def configure_logging(log_format: str, level: str) -> None:
    """structlog for our events, the same renderer for the standard library's (uvicorn's) records, on stderr.

    Our events are rendered by structlog and written straight to stderr, not handed to the standard library as
    records to be formatted there: the same lines (same keys, same order, same logger names), for about a sixth of
    the agent server's CPU per request (bench/bench_serve.py; a LogRecord, the handler and the formatter's copy of
    the event were most of what two log lines cost). The standard library's records go through a handler whose
    formatter runs the same processors."""
    console = log_format == "console" or (log_format == "auto" and sys.stderr.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if console else structlog.processors.JSONRenderer(serializer=_json_line)
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
    ]
    rendering: list[Any] = [*([] if console else [structlog.processors.format_exc_info]), renderer]
    structlog.configure(
        processors=[*shared, *rendering],
        logger_factory=lambda *args: _NamedWriteLogger(args[0] if args else "root"),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *rendering],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.captureWarnings(True)


def viewer_tokenizer(args: argparse.Namespace) -> Tokenizer | None:
    """The tokenizer that decodes the viewed records' tokens: --tokenizer, else the demo model's when built."""
    if args.tokenizer is not None:
        return HFTokenizer.from_file(args.tokenizer)
    from agent_train.demo import find_demo_model

    built = find_demo_model(args.demo)
    return HFTokenizer.from_file(built) if built is not None else None


def serve_viewer(args: argparse.Namespace) -> int:
    """`--trajectories PATH` without `--model`: the viewer alone, no model loaded."""
    try:
        app = create_viewer_app(args.trajectories, tokenizer=viewer_tokenizer(args))
    except (TrajectoryFilesError, TokenizerLoadError) as e:
        logger.error("startup_failed", error=str(e))
        return 1
    shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    url = f"http://{shown_host}:{args.port}"
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            serve(
                app,
                args.host,
                args.port,
                url,
                banner=f"Serving at {url}  (trajectory viewer of {args.trajectories}: {url}/)",
            )
        )
    return 0


def model_directory(model: str) -> Path:
    """The local directory of `--model`: itself, or for a Hub model id the cached snapshot of its config files."""
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, allow_patterns=MODEL_CONFIG_FILES))
    except Exception as e:  # not installed, not a repo id, offline and not cached: say what to pass instead
        raise RecipeError(
            f"--model {model!r} is not a local directory and its config could not be fetched ({type(e).__name__}: "
            f"{e}); pass a model directory, or --recipe to name the agent"
        ) from e


def serving_recipe(args: argparse.Namespace) -> Recipe:
    """The recipe to serve: `--recipe`; else, for a named model, one derived from its directory; else the demo's."""
    if args.recipe is not None:
        return load_recipe(args.recipe)
    if args.model is None:
        return running_total_recipe() if args.demo == "compaction" else demo_recipe()
    recipe = recipe_for_model(model_directory(args.model), context_length=args.context_length)
    logger.info(
        "recipe_derived", model=args.model, protocol=recipe.protocol, max_context_tokens=recipe.max_context_tokens,
        max_new_tokens=recipe.max_new_tokens,
    )  # fmt: skip
    return recipe


def program_episodes(recipe: Recipe) -> ProgramEpisodes | None:
    """What runs an agent-mode request: the recipe's own session (None), or its agent program when it has one."""
    program = recipe.agent
    if program is None:
        return None
    from agent_runtime import ProgramCommand
    from agent_runtime.proxy import ProgramEpisodes

    kind = "command" if isinstance(program.agent, ProgramCommand) else "function"
    logger.info("agent_program_served", recipe=recipe.name, program=kind, timeout_s=program.timeout_s)
    return ProgramEpisodes()


def demo_model_dir(demo: str = "calculator") -> Path:
    """The demo model's directory, built first when missing (training it needs agent-train; apps sit above it)."""
    from agent_train.demo import ensure_demo_model

    try:
        return ensure_demo_model(demo=demo)
    except Exception as e:  # the build failed (its error names the build log); nothing is served
        raise SystemExit(f"apps/serve: the demo model could not be built: {e}") from e


def context_length_of(model: str, given: int | None) -> int:
    if given is not None:
        return given
    config = Path(model) / "config.json"
    if config.is_file():
        value = json.loads(config.read_text()).get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return value
    return 32768


def engine_options(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """`make_engine`'s options for `--engine`, from the command line (flags left unset keep the engine's defaults)."""
    if args.engine == "openai":
        return {
            "base_url": [url.strip() for given in args.engine_url for url in given.split(",") if url.strip()],
            "session_header": args.session_header or None,
            "model": args.engine_model or model,
            "tokenizer": model,
            "context_length": context_length_of(model, args.context_length),
            "api_key": os.environ.get("AGENT_ENGINE_API_KEY"),
        }
    options: dict[str, Any] = {"model": model, "context_length": args.context_length}
    if args.engine == "hf":
        options |= {"device": args.device, "max_batch_tokens": args.max_batch_tokens}
        options |= {"join_ratio": args.join_ratio, "join_wait_steps": args.join_wait_steps}
    return {name: value for name, value in options.items() if value is not None}


def build_engine(args: argparse.Namespace, model: str) -> LLMEngine:
    return make_engine(args.engine, **engine_options(args, model))


def serve_config(args: argparse.Namespace, recipe: Recipe, model: str) -> ServeConfig:
    """The server's settings from the command line (the model's served name, its aliases, every limit)."""
    if args.served_model_name:
        name = args.served_model_name
    elif args.model is None:  # the demo model's directory is called "model"; the recipe's name says what it is
        name = recipe.name
    else:
        name = Path(model).name if Path(model).exists() else model
    return ServeConfig.from_args(
        args, model_name=name, aliases=(recipe.name,) if recipe.name != name else (), api_key=args.api_key
    )


async def serve(app: Any, host: str, port: int, url: str, banner: str | None = None) -> None:
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, timeout_graceful_shutdown=10)
    )
    running = asyncio.create_task(server.serve())
    while not server.started and not running.done():
        await asyncio.sleep(0.05)
    if server.started:
        print(banner or f"Serving at {url}  (web chat: {url}/  API: {url}/v1  health: {url}/health)", flush=True)
    await running


def main(argv: list[str] | None = None) -> int:
    ignore_pynvml_deprecation()
    args = parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    if args.trajectories is not None and args.model is None:
        return serve_viewer(args)
    if (unusable := store_unusable(args.store)) is not None:
        logger.error("startup_failed", error=unusable)
        return 2
    if args.replicas is not None:
        return serve_on_replicas(args)
    try:
        recipe = serving_recipe(args)
        model = args.model or str(demo_model_dir(args.demo))
        logger.info("engine_loading", engine=args.engine, model=model, recipe=recipe.name)
        engine = build_engine(args, model)
    except (RecipeError, RuntimeAgentError, OSError) as e:
        logger.error("startup_failed", error=str(e))
        return 1
    config = serve_config(args, recipe, model)
    app = create_app(engine, recipe, config, close_engine=True, episodes=program_episodes(recipe))
    shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it handled, after a clean shutdown
        asyncio.run(serve(app, args.host, args.port, f"http://{shown_host}:{args.port}"))
    return 0


def store_unusable(store: str) -> str | None:
    """Why `--store` cannot be used (Redis does not answer PING, redis-py is missing), or None. Checked before an
    engine loads or Ray starts: one process and `--replicas` then fail at once, with the same message (each
    replica checks again as it starts, since on a cluster it may not reach what this machine reaches)."""
    try:
        asyncio.run(check_store(store))
    except (StoreUnavailable, ValueError) as e:
        return f"--store: {e}"
    return None


def build_app(args: argparse.Namespace, model: str) -> Any:
    """The server as one replica builds it: its own recipe, engine and store from the same flags."""
    recipe = serving_recipe(args)
    config = serve_config(args, recipe, model)
    return create_app(build_engine(args, model), recipe, config, close_engine=True, episodes=program_episodes(recipe))


def serve_on_replicas(args: argparse.Namespace) -> int:
    """`--replicas N`: the same app in N Ray Serve replicas behind Ray's HTTP proxy (serving.ray_replicas)."""
    from agent_runtime.serving import serve_replicas

    try:
        require_ray_serve()
    except RayServeMissing as e:
        logger.error("startup_failed", error=str(e))
        return 2
    try:
        serving_recipe(args)  # a bad recipe or model fails here, before Ray starts
        model = args.model or str(demo_model_dir(args.demo))
    except (RecipeError, RuntimeAgentError, OSError) as e:
        logger.error("startup_failed", error=str(e))
        return 1
    shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    url = f"http://{shown_host}:{args.port}"
    banner = f"Serving at {url}  ({args.replicas} Ray Serve replicas; API: {url}/v1  health: {url}/health)"
    try:
        serve_replicas(
            lambda: build_app(args, model), replicas=args.replicas, host=args.host, port=args.port,
            ray_address=args.ray_address, on_ready=lambda: print(banner, flush=True),
        )  # fmt: skip
    except RuntimeError as e:
        logger.error("startup_failed", error=str(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
