"""apps/serve's log lines: our structlog events (written by structlog straight to stderr) and the standard library's
records (uvicorn's, warnings) come out as the same JSON lines, with the logger's name, the level, an ISO timestamp,
bound and context values, a rendered traceback, and the level filter applied. Run in a child process: configuring
logging is process-wide."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

EMIT = """
import logging, sys, structlog
sys.path.insert(0, sys.argv[1])
from apps.serve.__main__ import configure_logging
configure_logging(sys.argv[2], "info")
log = structlog.get_logger("agent_runtime.serving.app")
bound = log.bind(mode="agent", stream=False)
bound.info("request_served", duration_ms=1.5)
bound.debug("filtered_out")
structlog.contextvars.bind_contextvars(request="r1")
log.warning("request_failed", error='bad "input"')
structlog.contextvars.clear_contextvars()
try:
    1 / 0
except ZeroDivisionError:
    log.exception("failed")
logging.getLogger("uvicorn.error").info("uvicorn says %s", "hi")
logging.getLogger("uvicorn.error").debug("filtered out too")
"""


def _lines(log_format: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", EMIT, str(ROOT), log_format], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    return result.stderr.splitlines()


def test_json_lines_carry_the_name_level_time_and_values_of_each_event() -> None:
    events = [json.loads(line) for line in _lines("json")]
    assert [e["event"] for e in events] == ["request_served", "request_failed", "failed", "uvicorn says hi"]
    served, failed, crashed, foreign = events
    assert list(served) == ["mode", "stream", "duration_ms", "event", "logger", "level", "timestamp"]
    assert served["logger"] == "agent_runtime.serving.app" and served["level"] == "info"
    assert served["mode"] == "agent" and served["stream"] is False and served["duration_ms"] == 1.5
    assert served["timestamp"].endswith("Z") and served["timestamp"][:2] == "20"
    assert failed["request"] == "r1" and failed["error"] == 'bad "input"' and failed["level"] == "warning"
    assert crashed["level"] == "error" and crashed["exception"].endswith("ZeroDivisionError: division by zero")
    assert foreign["logger"] == "uvicorn.error" and foreign["level"] == "info" and "timestamp" in foreign


def test_values_json_has_no_form_for_are_rendered_as_before() -> None:
    """Lines are encoded by msgspec; an event holding what it cannot encode goes to json.dumps with structlog's
    fallback (the value's repr), and non-ASCII text stays readable."""
    code = (
        "import sys, structlog\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from apps.serve.__main__ import configure_logging\n"
        "configure_logging('json', 'info')\n"
        "log = structlog.get_logger('agent_runtime.serving.app')\n"
        "log.info('odd', value=object.__new__(type('Thing', (), {'__repr__': lambda self: '<thing>'})))\n"
        "log.info('text', value='\u00e9t\u00e9 \u2211')\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr
    odd, text = (json.loads(line) for line in result.stderr.splitlines())
    assert odd["event"] == "odd" and odd["value"] == "<thing>" and odd["logger"] == "agent_runtime.serving.app"
    assert text["value"] == "\u00e9t\u00e9 \u2211"


def test_a_line_that_cannot_be_written_is_dropped_and_the_caller_goes_on() -> None:
    """stderr on /dev/full: every write fails (ENOSPC), as on a full disk or a broken pipe; logging raises nothing."""
    code = (
        "import os, sys, structlog\n"
        "sys.stderr = open('/dev/full', 'w')\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from apps.serve.__main__ import configure_logging\n"
        "configure_logging('json', 'info')\n"
        "structlog.get_logger('agent_runtime.serving.app').bind(mode='agent').info('request_served')\n"
        "print('went on', flush=True)\n"
        "os._exit(0)\n"  # not the interpreter's exit, whose own flush of stderr would fail on /dev/full
    )
    result = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == "went on\n", result.stderr


def test_console_lines_name_the_logger_too() -> None:
    lines = _lines("console")
    assert "request_served" in lines[0] and "agent_runtime.serving.app" in lines[0] and "duration_ms" in lines[0]
    assert not any("filtered" in line for line in lines)
    assert any("uvicorn says hi" in line and "uvicorn.error" in line for line in lines)


PICKLED = """
import sys, cloudpickle, structlog
sys.path.insert(0, sys.argv[1])
from apps.serve.__main__ import configure_logging
configure_logging("json", "info")
log = structlog.get_logger("agent_runtime.serving.app")
log.info("before")  # caches the bound logger, as a module's first event does before Ray ships the app
shipped = cloudpickle.loads(cloudpickle.dumps(log))  # what `--replicas` sends each Ray Serve replica
shipped.info("in_replica", replica=1)
"""


def test_a_logger_shipped_to_a_replica_keeps_its_name() -> None:
    """`--replicas` pickles the app, and with it the loggers its modules cached: unpickled, each still writes lines
    with its name (a replica once failed at its first event, the name lost on the way)."""
    result = subprocess.run([sys.executable, "-c", PICKLED, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(line["event"], line["logger"]) for line in lines] == [
        ("before", "agent_runtime.serving.app"),
        ("in_replica", "agent_runtime.serving.app"),
    ]
    assert lines[1]["replica"] == 1
