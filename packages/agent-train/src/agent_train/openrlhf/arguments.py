"""OpenRLHF's own argument handling for `train_ppo_ray`, run without starting anything.

OpenRLHF 0.11 builds its parser inside ``if __name__ == "__main__":`` in `openrlhf/cli/train_ppo_ray.py`, then
validates the parsed arguments there (asserts and adjustments) and calls `train(args)`. Nothing of it is
importable, so this module reads that block from the installed file and runs it:

- `build_parser()` runs the statements before ``parser.parse_args()`` and returns OpenRLHF's parser;
- `check_arguments(argv)` runs the whole block on `argv` with `train` replaced by a function that keeps the final
  arguments, so everything OpenRLHF checks before training is checked here: a renamed flag, a bad choice, an
  estimator that needs ``--rollout.n_samples_per_prompt > 1``, a colocation whose GPU counts do not match.

Only the standard library and OpenRLHF's `hierarchize` (loaded from its file, without importing `openrlhf.utils`,
which would import torch) are in scope, so this takes milliseconds. The launcher checks every command it builds,
and the test suite checks the presets, so an OpenRLHF upgrade that renames a flag fails CI, not a user's job.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import msgspec

from agent_train.errors import LaunchError

__all__ = ["CheckedArguments", "build_parser", "check_arguments", "train_ppo_ray_path"]


class CheckedArguments(msgspec.Struct, frozen=True, kw_only=True):
    """What OpenRLHF made of the arguments: its nested namespace (`args.actor.model_name_or_path`, ...) and the
    warnings it printed while validating them."""

    args: Any
    warnings: list[str] = msgspec.field(default_factory=list)


def openrlhf_dir() -> Path:
    spec = importlib.util.find_spec("openrlhf")  # the package itself is empty: nothing heavy is imported
    if spec is None or not spec.submodule_search_locations:
        raise LaunchError("openrlhf is not installed in this environment (it is a dependency of agent-train)")
    return Path(next(iter(spec.submodule_search_locations)))


def train_ppo_ray_path() -> Path:
    """The installed `openrlhf/cli/train_ppo_ray.py`."""
    path = openrlhf_dir() / "cli" / "train_ppo_ray.py"
    if not path.is_file():
        raise LaunchError(f"{path} does not exist: this OpenRLHF release has no train_ppo_ray CLI")
    return path


@cache
def _main_block() -> tuple[str, list[ast.stmt], list[ast.stmt]]:
    path = train_ppo_ray_path()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    stdlib_imports: list[ast.stmt] = [
        node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) and _stdlib(node)
    ]
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return str(path), stdlib_imports, node.body
    raise LaunchError(f"{path} has no `if __name__ == '__main__':` block to read OpenRLHF's arguments from")


def _stdlib(node: ast.Import | ast.ImportFrom) -> bool:
    names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    return all(name.split(".")[0] in sys.stdlib_module_names for name in names)


def _is_parse_args(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr == "parse_args"
    )


def _run(statements: list[ast.stmt], filename: str, namespace: dict[str, Any]) -> None:
    module = ast.fix_missing_locations(ast.Module(body=statements, type_ignores=[]))
    exec(compile(module, filename, "exec"), namespace)


def build_parser() -> argparse.ArgumentParser:
    """OpenRLHF's `train_ppo_ray` argument parser, built by OpenRLHF's own code."""
    filename, imports, body = _main_block()
    end = next((i for i, node in enumerate(body) if _is_parse_args(node)), None)
    if end is None:
        raise LaunchError(f"{filename}: cannot find `args = parser.parse_args()` in the main block")
    namespace: dict[str, Any] = {"__name__": "_openrlhf_train_ppo_ray_args"}
    _run([*imports, *body[:end]], filename, namespace)
    parser = namespace.get("parser")
    if not isinstance(parser, argparse.ArgumentParser):
        raise LaunchError(f"{filename}: the main block does not build `parser`")
    return parser


class _ParseArgs(ast.NodeTransformer):
    """``parser.parse_args()`` -> ``parser.parse_args(__argv__)``; OpenRLHF's `hierarchize` import -> nothing
    (the function is provided, loaded from its file)."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "parse_args" and not node.args:
            node.args = [ast.Name(id="__argv__", ctx=ast.Load())]
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        if node.module == "openrlhf.utils.config":
            return ast.Pass()
        return node


@cache
def _hierarchize() -> Any:
    path = openrlhf_dir() / "utils" / "config.py"
    spec = importlib.util.spec_from_file_location("_openrlhf_utils_config", path)
    if spec is None or spec.loader is None:
        raise LaunchError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.hierarchize


def check_arguments(argv: Sequence[str]) -> CheckedArguments:
    """Run OpenRLHF's argument parsing and validation on `argv` (the flags after ``-m
    openrlhf.cli.train_ppo_ray``). Raises `LaunchError` with OpenRLHF's own message when it rejects them."""
    filename, imports, body = _main_block()
    tree = _ParseArgs().visit(ast.Module(body=[*imports, *body], type_ignores=[]))
    captured: list[Any] = []
    namespace: dict[str, Any] = {
        "__name__": "_openrlhf_train_ppo_ray_check",
        "__argv__": [str(a) for a in argv],
        "hierarchize": _hierarchize(),
        "train": captured.append,
    }
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            _run(tree.body, filename, namespace)
    except SystemExit as e:  # argparse: unknown flag, bad value or choice
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        message = lines[-1].split("error: ", 1)[-1] if lines else f"argparse exited with {e.code}"
        raise LaunchError(f"OpenRLHF rejects the arguments: {message}") from None
    except AssertionError as e:
        raise LaunchError(f"OpenRLHF rejects the arguments: {e or 'an assertion in train_ppo_ray failed'}") from e
    except Exception as e:  # OpenRLHF's checks assume some flags are set and fail on others' absence
        raise LaunchError(f"OpenRLHF's argument checks failed: {type(e).__name__}: {e}") from e
    if not captured:
        raise LaunchError(f"{filename}: the main block did not reach train(args)")
    warnings = [line.strip() for line in out.getvalue().splitlines() if line.strip()]
    return CheckedArguments(args=captured[0], warnings=warnings)
