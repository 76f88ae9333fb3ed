"""A model directory names its chat protocol: each of the 15 official templates maps to the registered protocol
that renders it, wherever the directory keeps its template; a template-less config falls back on an unambiguous
model_type; any other family is refused with the directory, what was found and the registered protocols."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_protocol import ProtocolDetectionError, detect_protocol, list_protocols, protocol_for_template
from tests.agent_protocol.golden import TEMPLATE_PROTOCOLS

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "golden" / "templates"
OFFICIAL = {f"{stem}.jinja": name for stem, name in TEMPLATE_PROTOCOLS.items()}
LLAMA_LIKE = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>{% endfor %}"


#: registered names whose official format is a Python encoder, not a chat template (detected by model_type only)
ENCODER_FORMATS = ("deepseek-v3.2",)


def test_every_official_template_is_covered() -> None:
    assert sorted(OFFICIAL) == sorted(p.name for p in TEMPLATES.glob("*.jinja"))
    assert sorted(OFFICIAL.values()) == [name for name in list_protocols() if name not in ENCODER_FORMATS]


def model_dir(root: Path, *, config: dict[str, object] | None = None, **files: object) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config if config is not None else {"model_type": "qwen3"}))
    for name, content in files.items():
        path = root / name.replace("__", ".")
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return root


@pytest.mark.parametrize(("file", "protocol"), OFFICIAL.items())
def test_each_official_template_names_its_protocol(file: str, protocol: str, tmp_path: Path) -> None:
    template = (TEMPLATES / file).read_text(encoding="utf-8")
    assert protocol_for_template(template) == protocol
    assert protocol in list_protocols()
    in_config = model_dir(tmp_path / "a", tokenizer_config__json={"chat_template": template})
    as_file = model_dir(tmp_path / "b", tokenizer_config__json={}, chat_template__jinja=template)
    named = model_dir(tmp_path / "c", tokenizer_config__json={"chat_template": [
        {"name": "tool_use", "template": LLAMA_LIKE}, {"name": "default", "template": template}]})  # fmt: skip
    assert detect_protocol(in_config) == detect_protocol(as_file) == detect_protocol(named) == protocol


def test_the_template_decides_over_model_type(tmp_path: Path) -> None:
    template = (TEMPLATES / "qwen3_4b_instruct_2507.jinja").read_text(encoding="utf-8")
    finetuned = model_dir(
        tmp_path / "m", config={"model_type": "llama"}, tokenizer_config__json={"chat_template": template}
    )
    assert detect_protocol(finetuned) == "qwen3-instruct-2507"
    assert detect_protocol(model_dir(tmp_path / "bare")) == "qwen3"  # no template: a Qwen3 config is the hybrid
    for model_type, name in (("gpt_oss", "gpt-oss"), ("glm4_moe", "glm-4.5")):
        assert detect_protocol(model_dir(tmp_path / model_type, config={"model_type": model_type})) == name
    with pytest.raises(ProtocolDetectionError, match="model_type 'llama', no chat template"):
        detect_protocol(model_dir(tmp_path / "llama", config={"model_type": "llama"}))  # 3.1 or 3.2: ambiguous


def test_an_unknown_family_is_refused_naming_the_registered_protocols(tmp_path: Path) -> None:
    llama = model_dir(
        tmp_path / "llama", config={"model_type": "llama"}, tokenizer_config__json={"chat_template": LLAMA_LIKE}
    )
    with pytest.raises(ProtocolDetectionError) as caught:
        detect_protocol(llama)
    message = str(caught.value)
    assert str(llama) in message and "model_type 'llama'" in message and "unknown family" in message
    assert ", ".join(list_protocols()) in message and caught.value.known == list_protocols()
    assert isinstance(caught.value, ValueError)
    with pytest.raises(ProtocolDetectionError, match="no model_type, no chat template"):
        detect_protocol(model_dir(tmp_path / "empty", config={}))
    with pytest.raises(ProtocolDetectionError, match="no such directory"):
        detect_protocol(tmp_path / "missing")
    broken = model_dir(tmp_path / "broken", tokenizer_config__json="{not json")
    with pytest.raises(ProtocolDetectionError, match=r"tokenizer_config\.json cannot be read"):
        detect_protocol(broken)
