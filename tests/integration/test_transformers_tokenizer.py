"""agent-protocol's adapter for a transformers tokenizer gives exactly the ids of the tokenizers-based one.

Lives outside tests/agent_protocol because it needs transformers, which agent-protocol must not depend on."""

from __future__ import annotations

from pathlib import Path

from agent_protocol import HFTokenizer, TransformersTokenizer, get_protocol, load_tokenizer

TEXTS = [
    "Hello, world!",
    "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call><|im_end|>',
    "émoji 🦙 and 中文\n\n\n  spaces",
]


def test_adapter_matches_the_tokenizers_wrapper(tiny_qwen3_dir: Path, qwen3_tokenizer_file: Path) -> None:
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    adapter = load_tokenizer(hf)
    assert isinstance(adapter, TransformersTokenizer)
    reference = HFTokenizer.from_file(qwen3_tokenizer_file)
    prompt = get_protocol("qwen3").render_prompt([{"role": "user", "content": "Hi"}])
    for text in [*TEXTS, prompt]:
        assert adapter.encode(text) == reference.encode(text)
        assert adapter.decode(adapter.encode(text)) == reference.decode(reference.encode(text))
    assert adapter.token_to_id("<|im_end|>") == reference.token_to_id("<|im_end|>") == 151645
    assert adapter.token_to_id("definitely-not-a-token") is None
