"""The figures registry's tool (`uv run scripts/figures --help`): `tables` reads and rewrites Markdown tables,
`registry` reads and writes docs/figures.toml, `check` compares the two, `measure` re-runs rows' commands."""
