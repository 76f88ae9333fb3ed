"""The figures registry (docs/figures.toml, scripts/figures): every README table of measured figures matches it.

`test_the_readmes_match_the_registry` is the CI check. The others run the tool on a small fake repository in
tmp: a README with a marked table, a table of flags, prose around them, and a registry; they change one thing at a
time and expect `check` to name it, `write` to put the registry's cells back and leave every other byte, and
`run` to re-run a real command (bash) and read its figures from a JSON file and from its output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from figures.adopt import ADOPTED, adopt  # noqa: E402
from figures.check import check, write  # noqa: E402
from figures.derived import refresh  # noqa: E402
from figures.measure import MeasureError, format_cell, read_value, run, select  # noqa: E402
from figures.registry import RegistryError, dumps, load, loads, save_rows  # noqa: E402
from figures.tables import find_tables, has_figure, split_row  # noqa: E402

README = """# Fake

Some prose before, with a figure in it: 42.

<!-- figures: demo -->
| seed | before | after RL | wall |
|---|---|---|---|
| 0 | 0.0% | **98.0%** | 90 s |
| 1 (an older run) | 0.0% | 72.0% | 100 s |

Prose between.

| flag | meaning |
|---|---|
| `--lr 1e-4` | learning rate, 3 decimals |

```
| not | a table |
|---|---|
| 1 | 2 |
```
Prose after.
"""

REGISTRY = """# a registry for the tests

[[exempt]]
file = "README.md"
header = ["flag", "meaning"]
reason = "flags, not measurements"

[tables.demo]
file = "README.md"
header = ["seed", "before", "after RL", "wall"]

[tables.demo.parse]
"before" = "json:{run_dir}/summary.json#figures.before"
"after RL" = "re:after RL ([0-9.]+)"
"wall" = "json:{run_dir}/summary.json#elapsed_s"

[tables.demo.format]
"before" = "{0:.1%}"
"after RL" = "**{0:.1%}**"
"wall" = "{0:.0f} s"

[[tables.demo.rows]]
name = "seed0"
label = "0"
command = "bash measure.sh {run_dir}"
run_dir = "runs/s0"
commit = "abc1234"
measured = "2026-12-01"
machine = "2 cores"

[tables.demo.rows.values]
"before" = "0.0%"
"after RL" = "**98.0%**"
"wall" = "90 s"

[[tables.demo.rows]]
name = "seed1"
label = "1 (an older run)"
command = "true"
commit = "abc1234"
measured = "2026-12-01"
machine = "2 cores"
pinned = "an older state of the code"

[tables.demo.rows.values]
"before" = "0.0%"
"after RL" = "72.0%"
"wall" = "100 s"
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "measure.sh").write_text(  # a command that leaves a summary and prints a figure, as apps/train does
        'mkdir -p "$1"\necho \'{"figures": {"before": 0.125}, "elapsed_s": 61.4}\' > "$1/summary.json"\n'
        "echo 'after RL 0.75'\n"
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "figures.toml").write_text(REGISTRY)
    return tmp_path


def problems(repo: Path) -> list[str]:
    return check(repo, load(repo / "docs" / "figures.toml"))


def test_the_readmes_match_the_registry() -> None:
    found = check(ROOT, load(ROOT / "docs" / "figures.toml"))
    assert not found, "README tables and docs/figures.toml differ:\n" + "\n".join(found)


def test_the_registry_is_written_as_the_tool_writes_it() -> None:
    """`run` rewrites the file with `dumps`: the committed file is already in that form, so a run's diff shows
    only what it measured."""
    text = (ROOT / "docs" / "figures.toml").read_text(encoding="utf-8")
    assert dumps(loads(text)) == text


def test_the_fake_repository_passes(repo: Path) -> None:
    assert problems(repo) == []


def test_a_cell_changed_in_the_readme_and_not_in_the_registry_fails(repo: Path) -> None:
    text = README.replace("| 0 | 0.0% | **98.0%** | 90 s |", "| 0 | 0.0% | **99.0%** | 90 s |")
    (repo / "README.md").write_text(text)
    [problem] = problems(repo)
    assert "row `seed0`, column `after RL`" in problem and "'**99.0%**'" in problem and "'**98.0%**'" in problem


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("| 1 (an older run) |", "| 1 (a newer run) |", "rows differ from the registry"),
        ("| seed | before |", "| seed | initial |", "header"),
        ("<!-- figures: demo -->\n", "", "has no `<!-- figures: demo -->`"),
        ("<!-- figures: demo -->", "<!-- figures: other -->", "`other` is not in the registry"),
        ("| flag | meaning |", "| option | meaning |", "neither marked"),
        ("Prose between.", "<!-- figures: demo -->\nProse between.", "not followed by a table"),
    ],
)
def test_check_names_what_drifted(repo: Path, old: str, new: str, expected: str) -> None:
    assert old in README
    (repo / "README.md").write_text(README.replace(old, new, 1))
    found = problems(repo)
    assert any(expected in problem for problem in found), found


def test_an_exemption_that_matches_nothing_fails(repo: Path) -> None:
    (repo / "README.md").write_text(README.replace("| `--lr 1e-4` | learning rate, 3 decimals |", "| `--lr` | rate |"))
    assert any("matches no table" in problem for problem in problems(repo))


def test_write_puts_the_registry_back_and_keeps_every_other_byte(repo: Path) -> None:
    drifted = README.replace("**98.0%**", "**99.0%**").replace("| 100 s |", "|100 s|")
    (repo / "README.md").write_text(drifted)
    assert write(repo, load(repo / "docs" / "figures.toml")) == ["README.md"]
    # the second row's cells did not change, only its spacing: it is kept as the README had it
    assert (repo / "README.md").read_text() == README.replace("| 100 s |", "|100 s|")
    assert problems(repo) == []


def test_run_re_measures_a_row_and_rewrites_its_cells(repo: Path) -> None:
    registry = load(repo / "docs" / "figures.toml")
    selected = select(registry, ["demo"], runnable=True)
    assert [item.name for item in selected] == ["demo.seed0"]  # the pinned row is left out of a whole table
    moved = run(registry, selected, repo, machine="test box", echo=lambda line: None)
    assert moved == [
        "demo.seed0 `before`: 0.0% -> 12.5%",
        "demo.seed0 `after RL`: **98.0%** -> **75.0%**",
        "demo.seed0 `wall`: 90 s -> 61 s",
    ]
    row = registry.tables["demo"].rows[0]
    assert (row.machine, row.measured) == ("test box", time.strftime("%Y-%m-%d", time.gmtime()))
    assert row.source == "scripts/figures run"
    write(repo, registry)
    text = (repo / "README.md").read_text()
    assert "| 0 | 12.5% | **75.0%** | 61 s |" in text
    assert text.replace("| 0 | 12.5% | **75.0%** | 61 s |", "| 0 | 0.0% | **98.0%** | 90 s |") == README
    assert check(repo, registry) == []


def test_run_refuses_before_anything_runs(repo: Path) -> None:
    registry = load(repo / "docs" / "figures.toml")
    selected = select(registry, ["demo.seed0", "demo.seed1"], runnable=True)  # named exactly: kept, to refuse
    registry.tables["demo"].parse.pop("wall")
    registry.tables["demo"].rows[1].run_dir = "runs/s0"
    with pytest.raises(MeasureError) as raised:
        run(registry, selected, repo, machine="m", echo=lambda line: None)
    message = str(raised.value)
    assert "demo.seed1 is pinned: an older state of the code" in message
    assert "demo.seed0: column `wall` ('90 s') has no parse spec" in message
    assert "demo.seed1 and demo.seed0 write runs/s0 with different commands" in message
    assert not (repo / "runs").exists()


def test_a_failing_command_or_a_stale_file_is_an_error(repo: Path) -> None:
    registry = load(repo / "docs" / "figures.toml")
    [item] = select(registry, ["demo.seed0"])
    item.row.command = "echo half way; exit 3"
    with pytest.raises(MeasureError, match="exited 3; its last output:\nhalf way"):
        run(registry, [item], repo, machine="m", echo=lambda line: None)
    (repo / "runs" / "s0").mkdir(parents=True)
    stale = repo / "runs" / "s0" / "summary.json"
    stale.write_text('{"figures": {"before": 0.5}, "elapsed_s": 1}')
    os.utime(stale, (time.time() - 60, time.time() - 60))
    item.row.command = "echo after RL 0.5"
    with pytest.raises(MeasureError, match="was not written by this run"):
        run(registry, [item], repo, machine="m", echo=lambda line: None)
    assert item.row.values["before"] == "0.0%"


def test_parse_specs(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps({"a": {"b": [0.25, 0.5, 0.75]}, "t": 630}))
    assert read_value("json:s.json#a.b.-1", "", tmp_path) == 0.75
    assert read_value("json:s.json#a.b.0", "", tmp_path) == 0.25
    assert read_value("json:s.json#t/60", "", tmp_path) == 10.5
    assert read_value("re:improved (\\d+)", "x improved 29, worsened 5", tmp_path) == 29
    assert read_value("re:p = ([-+.\\deE]+)", "p = 2e-05", tmp_path) == 2e-05
    out = "mean success 0.637 -> 0.755; improved 29, worsened 5"
    assert format_cell(["re:improved (\\d+)", "re:worsened (\\d+)"], "={v[0] - v[1]:+d}", out, tmp_path) == "+24"
    assert format_cell("json:s.json#a.b", "{0[1]:.1%}", "", tmp_path) == "50.0%"
    assert format_cell(["json:s.json#a.b"], "={span([x * 100 for x in v[0]])}", "", tmp_path) == "25.0-75.0%"
    assert format_cell(["json:s.json#a.b.0"], "={span([v[0], v[0]], '.2f', '')}", "", tmp_path) == "0.25"
    for spec, message in [
        ("json:s.json#a.c", "no `c`"),
        ("json:s.json", "json:PATH#KEY"),
        ("json:missing.json#a", "cannot read"),
        ("re:nothing (\\d+)", "no match"),
        ("yaml:s.json#a", "starts with json: or re:"),
        ("json:s.json#a/2", "not a number"),
    ]:
        with pytest.raises(MeasureError, match=message):
            read_value(spec, "", tmp_path)
    with pytest.raises(MeasureError, match="does not fit"):
        format_cell("json:s.json#t", "{1}", "", tmp_path)


def test_a_bad_registry_is_refused_with_where_it_is() -> None:
    good = REGISTRY
    for old, new, message in [
        ('machine = "2 cores"', "machine = 2 cores", "not valid TOML"),
        ('"wall" = "90 s"\n', "", "missing ['wall']"),
        ('name = "seed1"', 'name = "seed0"', "row names must be unique"),
        ('command = "true"', 'command = ""', "an empty command needs a `note`"),
        ('"wall" = "{0:.0f} s"', '"walls" = "{0:.0f} s"', "`walls`, which is not a column"),
        ('pinned = "an older', 'pined = "an older', "unknown key(s) pined"),
    ]:
        assert old in good
        with pytest.raises(RegistryError, match=re.escape(message)):
            loads(good.replace(old, new, 1))


def test_tables_and_figures_are_found_as_github_renders_them() -> None:
    tables = find_tables(README)
    assert [(t.marker, t.header[0], len(t.rows)) for t in tables] == [("demo", "seed", 2), (None, "flag", 1)]
    assert split_row(r"| a \| b | `c` |") == [r"a \| b", "`c`"]
    assert has_figure("0.99 ms") and has_figure("400") and has_figure("**98.0%**")
    assert not has_figure("`--lr 1e-4`") and not has_figure("Qwen3 and qwen2_5") and not has_figure("text")


def test_the_command_line(repo: Path) -> None:
    tool = [sys.executable, str(ROOT / "scripts" / "figures"), "--root", str(repo)]
    ok = subprocess.run([*tool, "check"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    listed = subprocess.run([*tool, "list"], capture_output=True, text=True, timeout=60)
    assert "demo.seed1\n    pinned: an older state of the code" in listed.stdout
    (repo / "README.md").write_text(README.replace("| 90 s |", "| 91 s |"))
    failed = subprocess.run([*tool, "check"], capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1 and "column `wall`" in failed.stdout
    ran = subprocess.run([*tool, "run", "demo"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "| 0 | 12.5% | **75.0%** | 61 s |" in (repo / "README.md").read_text()
    assert subprocess.run([*tool, "check"], capture_output=True, timeout=60).returncode == 0
    bad = subprocess.run([*tool, "run", "nothing"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "names no row" in bad.stderr


HEADLINE = """
<!-- figures: headline -->
| run | after RL |
|---|---|
| seeds 0-1 | 72.0-98.0% |
"""

HEADLINE_ENTRY = """
[tables.headline]
file = "README.md"
header = ["run", "after RL"]

[[tables.headline.rows]]
name = "range"
label = "seeds 0-1"
command = ""
commit = "abc1234"
measured = "2026-12-01"
machine = "2 cores"
note = "derived from the demo rows"

[tables.headline.rows.values]
"after RL" = "72.0-98.0%"

[tables.headline.rows.parse]
"after RL" = "row:demo.*#after RL"

[tables.headline.rows.format]
"after RL" = "={span(v[0])}"
"""


def test_a_derived_row_follows_its_sources(repo: Path) -> None:
    (repo / "README.md").write_text(README + HEADLINE)
    (repo / "docs" / "figures.toml").write_text(REGISTRY + HEADLINE_ENTRY)
    assert problems(repo) == []
    registry = load(repo / "docs" / "figures.toml")
    run(registry, select(registry, ["demo"], runnable=True), repo, machine="box", echo=lambda line: None)
    [stale] = [p for p in check(repo, registry) if "derived" in p]
    assert "derived row headline.range, column `after RL`: '72.0-98.0%', but its source rows give '72.0-75.0%'" in stale
    assert refresh(registry) == ["headline.range `after RL`: 72.0-98.0% -> 72.0-75.0%"]
    row = registry.tables["headline"].rows[0]
    assert (row.commit.split(", ")[-1], row.machine) == ("abc1234", "box; 2 cores")  # seed 1's commit stays
    write(repo, registry)
    assert "| seeds 0-1 | 72.0-75.0% |" in (repo / "README.md").read_text()
    assert check(repo, registry) == []


def test_adopt_takes_a_reshaped_table_and_keeps_each_rows_command(repo: Path) -> None:
    reshaped = README.replace("| seed | before | after RL | wall |", "| seed | before | after RL | wall | note |")
    reshaped = reshaped.replace("|---|---|---|---|\n| 0 |", "|---|---|---|---|---|\n| seed 0 |")
    reshaped = reshaped.replace("| 90 s |", "| 90 s | fresh |").replace("| 100 s |", "| 100 s | old |")
    reshaped = reshaped.replace("| 100 s | old |", "| 100 s | old |\n| 2 | 0.0% | 50.0% | 95 s | new |")
    (repo / "README.md").write_text(reshaped)
    registry = load(repo / "docs" / "figures.toml")
    assert any("header" in p for p in check(repo, registry))
    changes = adopt(repo, registry, "demo")
    assert "row `seed0` relabelled: '0' -> 'seed 0'" in changes and "new row `2` (2)" in changes
    seed0, seed1, new = registry.tables["demo"].rows
    assert (seed0.name, seed0.command, seed0.values["note"]) == ("seed0", "bash measure.sh {run_dir}", "fresh")
    assert seed1.pinned and (new.command, new.note) == ("", ADOPTED)
    # the new row has figures and no provenance yet: check says so, and nothing else
    assert check(repo, registry) == [
        "README.md:6: row `2` has figures but no commit, measured, machine in the registry"
    ]
    with pytest.raises(LookupError, match="no table marked"):
        adopt(repo, registry, "missing", "README.md")


def test_two_runs_side_by_side_keep_each_others_rows(repo: Path) -> None:
    """Each `run` saves its rows into the registry as it is on disk then, under a lock: two long runs started
    together (two trainings at once) do not save over each other."""
    path = repo / "docs" / "figures.toml"
    first, second = load(path), load(path)
    run(first, select(first, ["demo.seed0"]), repo, machine="first", echo=lambda line: None)
    second.tables["demo"].rows[1].note = "measured by the second run"
    save_rows(path, [("demo", first.tables["demo"].rows[0])])
    save_rows(path, [("demo", second.tables["demo"].rows[1])])
    seed0, seed1 = load(path).tables["demo"].rows
    assert (seed0.machine, seed0.values["after RL"]) == ("first", "**75.0%**")
    assert seed1.note == "measured by the second run"
    with pytest.raises(RegistryError, match="is gone from the registry"):
        save_rows(path, [("demo", dataclasses.replace(seed0, name="renamed"))])


def test_the_registrys_specs_read_what_the_evaluation_tools_print(tmp_path: Path) -> None:
    """The ci-check and OpenRLHF rows read `agent_train.local.sampled` and `paired` output by regex: fed the lines
    those tools print (`BEFORE -> AFTER, <summary>`), the registry's own specs and formats give the README's cells."""
    from agent_train.local.paired import compare
    from agent_train.local.sampled import compare_rates

    registry = load(ROOT / "docs" / "figures.toml")
    # 100 problems: 29 improved, 5 worsened, as the README's seed-0 row
    before = [0.5] * 100
    after = [0.75] * 29 + [0.25] * 5 + [0.5] * 66
    sampled = f"a -> b, {compare_rates(before, after).summary()}"
    entry = registry.tables["train-ci-check"]
    row = entry.rows[0]
    got = {c: format_cell(entry.spec(row, c), entry.fmt(row, c), sampled, tmp_path) for c in ["improved", "net"]}
    assert got == {"improved": "29", "net": "+24"}
    assert format_cell(entry.spec(row, "sign test p"), entry.fmt(row, "sign test p"), sampled, tmp_path) == "2e-05"
    # OpenRLHF's CPU run: sampled then paired output, one after the other, as its command prints them
    greedy = compare([True] * 137 + [False] * 63, [True] * 134 + [False] * 3 + [True] * 13 + [False] * 50)
    output = sampled + "\n" + f"c -> d, {greedy.summary()}\n"
    learns = registry.tables["openrlhf-cpu-learns"]
    cells = {
        r.name: [format_cell(learns.spec(r, c), learns.fmt(r, c), output, tmp_path) for c in learns.keys]
        for r in learns.rows
    }
    assert cells["sampled"] == ["0.500", "0.560", "29 improved, 5 worsened, p = 2e-05"]
    assert cells["greedy"] == ["68.5%", "73.5%", "13 fixed, 3 broken, p = 0.011"]


def test_the_registrys_json_specs_name_keys_the_runs_write() -> None:
    """Every `summary.json` key a spec reads is one the command's program writes: the local trainer's figures
    (`agent_train.local.cli`'s list) and `elapsed_s` (and under `--async K` its `rl_staleness`: the trained
    episodes by staleness 0..K, and `dropped`), or a field of examples/any_agent's result (`ProgramTrainResult`)."""
    import ast

    from agent_train.local.cli import _FIGURES

    trainer = {f"figures.{key}" for key, _ in _FIGURES} | {"elapsed_s"}
    training = ROOT / "packages" / "agent-train" / "src" / "agent_train" / "local" / "program_training.py"
    tree = ast.parse(training.read_text(encoding="utf-8"))  # examples/any_agent/train.py's run and result
    result = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ProgramTrainResult")
    any_agent = {n.target.id for n in result.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    registry = load(ROOT / "docs" / "figures.toml")
    checked = 0
    for entry in registry.tables.values():
        for row in entry.rows:
            for column in entry.keys:
                spec = entry.spec(row, column)
                for one in [] if spec is None else [spec] if isinstance(spec, str) else spec:
                    if not row.command or not one.startswith("json:{run_dir}/summary.json#"):
                        continue
                    key = one.split("#", 1)[1].rsplit("/", 1)[0]
                    if "uv run apps/train" in row.command:
                        staleness = re.fullmatch(r"rl_staleness\.(\d+|dropped)", key)
                        ahead = re.search(r"--async (\d+)", row.command)
                        if staleness is not None and ahead is not None:  # trained episodes by staleness 0..K
                            assert staleness[1] == "dropped" or int(staleness[1]) <= int(ahead[1]), (entry.id, key)
                        else:
                            assert key in trainer, (entry.id, row.name, key)
                    else:
                        assert "examples.any_agent.train" in row.command, (entry.id, row.name)
                        assert key.split(".")[0] in any_agent, (entry.id, row.name, key)
                    checked += 1
    assert checked > 100
