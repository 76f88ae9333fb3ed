"""The model families, in one table: for each, the module that holds it, the names it registers, the marks of its
chat template and its row in the package README. Everything that lists families reads this table: the registry
(which module a name lives in), protocol detection (which template is which family), the README's family table
(tests/agent_protocol/test_families.py checks it equals `readme_table()`), the golden tests and
bench/bench_transcript.py. A new family is one module and one entry here (or `register_family` at run time).

The table knows names, module paths, template marks and prose; it imports no family module (the registry does, on
first use) and renders nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "Family",
    "Member",
    "ReadmeRow",
    "family_of",
    "family_table",
    "readme_table",
    "register_family",
    "unregister_family",
]

_PROTOCOLS_PACKAGE: Final = "agent_protocol.protocols"


@dataclass(frozen=True, kw_only=True)
class Member:
    """One registered name of a family, and how its official chat template is told from every other one."""

    #: the registered name, a key of the module's `PROTOCOLS`
    name: str
    #: texts that must all be in the template for it to be this member's (empty: detection never names it)
    marks: tuple[str, ...] = ()
    #: texts that must not be in it
    absent: tuple[str, ...] = ()
    #: `config.json` `model_type`s that name this member when a directory has no chat template
    model_types: tuple[str, ...] = ()
    #: the official template's file stem under tests/data/golden/templates (None: none kept there)
    template: str | None = None

    def matches(self, chat_template: str) -> bool:
        return (
            bool(self.marks)
            and all(m in chat_template for m in self.marks)
            and not any(m in chat_template for m in self.absent)
        )


@dataclass(frozen=True, kw_only=True)
class ReadmeRow:
    """The family's row in the package README's table (the first cell, names and options, is derived)."""

    golden: str
    jinja: str
    parser: str
    tito: str
    seams: str
    #: said after the names in the first cell, in parentheses (e.g. the models the template serves)
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Family:
    """One family module and the names it registers. `module` is a module under `agent_protocol.protocols` or a
    full dotted path; it ends with `PROTOCOLS`, a mapping of each member's name to its factory."""

    module: str
    members: tuple[Member, ...]
    readme: ReadmeRow | None = None

    @property
    def module_path(self) -> str:
        return self.module if "." in self.module else f"{_PROTOCOLS_PACKAGE}.{self.module}"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(member.name for member in self.members)


_IM: Final = "<|im_start|>"
_QWEN3: Final = (_IM, "<tool_call>", "reasoning_content")
_THINKING_HEADER: Final = "'<|im_start|>assistant\\n<think>\\n'"  # as the template writes the string literal
_VISION: Final = "<|vision_start|><|image_pad|><|vision_end|>"
#: Qwen3.5 / Qwen3.6: Qwen3-Coder's XML calls with Qwen3's reasoning (placed first: qwen3's and qwen3-coder's marks
#: are in these templates too)
_QWEN35: Final = (_IM, "<function=", "<parameter=", "reasoning_content is string", "render_content")
_KIMI_TOOLS: Final = "<|im_system|>tool_declare<|im_middle|>"
#: GLM-4.6's user turn (GLM-4.5's sets a variable instead); it renders the same bytes
_GLM46: Final = 'not visible_text(m.content).endswith("/nothink")'
#: GLM-4.7's reasoning switch, in the form its template has (GLM-5's tests `reasoning_content is defined`)
_GLM47: Final = ("clear_thinking", "ns.last_user_index) and reasoning_content -%}")
_DEEPSEEK_VLLM_TOOLS: Final = "You have access to the following tools:"

#: every built-in family, in README order; detection checks the members in this order and the first match wins
_TABLE: Final[list[Family]] = [
    Family(
        module="qwen3_5",
        members=(
            Member(name="qwen3.6", marks=(*_QWEN35, "preserve_thinking"), template="qwen3.6"),
            Member(name="qwen3.5", marks=_QWEN35, absent=("preserve_thinking",), template="qwen3.5"),
        ),
        readme=ReadmeRow(
            golden="48 / 48 (generated from the official templates)",
            jinja="1,600 renders (160 conversations x 5 variants x gen prompt) + 1,080 refusals the templates raise; "
            "656 more with images (+ 416 refusals); every tool shape",
            parser="`qwen3_coder` (typed by the episode's tool schemas) + `qwen3` reasoning, `<think>` opened by the "
            "prompt",
            tito="token level through `AgentSession` with the Qwen3 tokenizer as a stand-in (the same control tokens; "
            "Qwen3's ids: no Qwen3.5 tokenizer can be had verified); prompt + generations + feedback == official "
            "render on 37 generated episodes",
            seams="reasoning dropped before the last user query unless `preserve_thinking=True` (Qwen3.6; a new user "
            "message moves it, tool results do not); content and reasoning trimmed; Qwen3.5 writes `True`/`None`; "
            "tokens only: an empty reasoning's `\\n`+`\\n` vs `\\n\\n`, as Thinking-2507",
            note="Qwen/Qwen3.5-9B and Qwen/Qwen3.6-27B templates, images in user, assistant and tool messages",
        ),
    ),
    Family(
        module="qwen3",
        members=(
            Member(
                name="qwen3",
                marks=(*_QWEN3, "enable_thinking", "reasoning_content is string"),
                absent=(_THINKING_HEADER,),
                model_types=("qwen3", "qwen3_moe"),
                template="qwen3",
            ),
            Member(
                name="qwen3-instruct-2507",
                marks=_QWEN3,
                absent=(_THINKING_HEADER, "enable_thinking"),
                template="qwen3_4b_instruct_2507",
            ),
            Member(
                name="qwen3-thinking-2507",
                marks=(*_QWEN3, _THINKING_HEADER),
                absent=("truncate_history_thinking",),  # Nemotron 3 Nano's template has the same header
                template="qwen3_4b_thinking_2507",
            ),
        ),
        readme=ReadmeRow(
            golden="48 / 48",
            jinja="2,400 (150 conversations x 4 variants x tools x gen prompt) + 156 per template and variant with "
            "every tool shape",
            parser="`hermes` + `qwen3` reasoning",
            tito="token level, real Qwen3 tokenizer, every golden case and through `AgentSession`",
            seams="reasoning dropped before the last user query; an empty `<think>` block re-rendered away; "
            "Thinking-2507 `\\n`+`\\n` vs `\\n\\n`",
        ),
    ),
    Family(
        module="qwen3",
        members=(
            Member(
                name="qwen3-2504",
                marks=(*_QWEN3, "enable_thinking"),
                absent=(_THINKING_HEADER, "reasoning_content is string"),
                template="qwen3_initial_2504",
            ),
        ),
        readme=ReadmeRow(
            golden="24 / 24",
            jinja="800 (400 per variant) + tool shapes",
            parser="`hermes` + `qwen3` reasoning",
            tito="token level, Qwen3 tokenizer, through `AgentSession`",
            seams="as `qwen3`",
        ),
    ),
    Family(
        module="qwen2_5",
        members=(
            Member(
                name="qwen2.5",
                marks=(_IM, "<tool_call>", "created by Alibaba Cloud"),
                absent=("reasoning_content",),
                template="qwen2.5_instruct",
            ),
        ),
        readme=ReadmeRow(
            golden="12 / 12",
            jinja="400 with every tool shape",
            parser="`hermes`, no reasoning",
            tito="token level, Qwen3 tokenizer (Qwen2.5's vocabulary plus think tokens), through `AgentSession`",
            seams="none: append-only",
        ),
    ),
    Family(
        module="qwen3_coder",
        members=(
            Member(
                name="qwen3-coder",
                marks=(_IM, "<function=", "<parameter="),
                absent=("truncate_history_thinking",),  # Nemotron 3 Nano's template writes the same calls
                template="qwen3_coder",
            ),
        ),
        readme=ReadmeRow(
            golden="12 / 12",
            jinja="400 with every tool shape in its XML listing",
            parser="`qwen3_coder`: `<function=...><parameter=...>`, values typed by the tools' JSON schemas "
            "(`with_tools`)",
            tito="token level, Qwen3 tokenizer, through `AgentSession`",
            seams="a call not in the template's layout (`true`, `2.50`, one newline) re-renders to other bytes",
        ),
    ),
    Family(
        module="qwen_vl",
        members=(
            Member(
                name="qwen3-vl",
                marks=(_IM, _VISION, "<tool_call>"),
                absent=("reasoning_content",),
                template="qwen3_vl_instruct",
            ),
        ),
        readme=ReadmeRow(
            golden="every render in tests/data/golden/vision (images and tools, generated from the official template)",
            jinja="generated conversations with images in user and tool messages and every tool shape, and "
            "text-only ones; images where the template drops them (system, assistant) refused",
            parser="`hermes`, no reasoning",
            tito="token level, Qwen3 tokenizer, through `AgentSession`, images in tool results",
            seams="none: append-only",
        ),
    ),
    Family(
        module="qwen2_5_vl",
        members=(
            Member(
                name="qwen2.5-vl",
                marks=(_IM, _VISION, "You are a helpful assistant."),
                absent=("<tool_call>",),
                template="qwen2_5_vl_instruct",
            ),
        ),
        readme=ReadmeRow(
            note="Qwen2-VL / Qwen2.5-VL-Instruct",
            golden="no golden renders (generated only)",
            jinja="800 (200 conversations with images in every role and system messages anywhere, 200 text-only, "
            "x gen prompt); `tools=` and tool calls refused (the template renders none)",
            parser="`hermes`, no reasoning (as `qwen3-vl`)",
            tito="token level, Qwen3 tokenizer, through `AgentSession` (no tools)",
            seams="none: append-only, system messages in feedback included; a `<tool_call>` the model writes is "
            "parsed, but the history cannot render it",
        ),
    ),
    Family(
        module="llama3",
        members=(
            Member(
                name="llama3.1",
                marks=("<|start_header_id|>", "ipython"),
                absent=("strftime_now",),
                template="llama3.1_instruct",
            ),
            Member(
                name="llama3.2", marks=("<|start_header_id|>", "ipython", "strftime_now"), template="llama3.2_instruct"
            ),
        ),
        readme=ReadmeRow(
            golden="20 / 20, and the 4 refused (two calls in one message) raise",
            jinja="1,600 (5 variants x 160 x gen prompt), the template's refusals matched",
            parser="`llama3_json`: `{...}` scan, `parameters`/`arguments`, `;`-separated calls, `<\\|python_tag\\|>`",
            tito="token level, official Llama 3 `tokenizer.json` with 3.1's names for 128004/128008/128010, golden "
            "cases id for id and through `AgentSession`",
            seams="`<\\|eom_id\\|>` re-rendered as `<\\|eot_id\\|>`; `<\\|python_tag\\|>` and text next to a call "
            "dropped; content trimmed",
        ),
    ),
    Family(
        module="llama4",
        members=(
            Member(
                name="llama4",
                marks=("<|header_start|>", "<|python_start|>"),
                model_types=("llama4",),
                template="llama4",
            ),
        ),
        readme=ReadmeRow(
            note="Llama 4 Scout / Maverick",
            golden="12 / 12 (generated from the official template)",
            jinja="800 (200 conversations with every tool shape and up to 3 calls a turn x 2 variants x gen prompt): "
            "790 equal, 10 refusals matched; content as lists of text parts equal where the template joins them, "
            "refused where it does not; images refused",
            parser="`llama4_json` (= `llama3_json`): `<\\|python_start\\|>` block as content, then `{...}` calls "
            "with `parameters`/`arguments`, any number",
            tito="token level, Llama 4's tokenizer built from Meta's tiktoken ranks (PyPI llama-models; ids equal to "
            "Meta's tokenizer's on 5,408 texts), golden episodes id for id and through `AgentSession`",
            seams="`<\\|eom\\|>` re-rendered as `<\\|eot\\|>`; a call without the python block gets an empty one; "
            "text after the calls moved into the block",
        ),
    ),
    Family(
        module="deepseek_v31",
        members=(
            Member(
                name="deepseek-v3.1",
                marks=("<｜Assistant｜>", "<｜tool▁sep｜>", "</think>"),
                absent=(_DEEPSEEK_VLLM_TOOLS,),
                template="deepseek_v3.1",
            ),
        ),
        readme=ReadmeRow(
            golden="24 / 24",
            jinja="636 (160 x 2 variants x gen prompt)",
            parser="`deepseek_v31` tool parser + `deepseek_v31` reasoning",
            tito="token level, official DeepSeek-V3 `tokenizer.json`, and a variant with V3.1's `<think>`/`</think>` "
            "tokens, through `AgentSession`",
            seams="thinking on: `<think>r</think>` generated vs `</think>` in history; the official template does not "
            "show the tools list (`ToolsNotRenderedWarning`, once per protocol object, names the fix: "
            "`deepseek-v3.1-vllm-tools`)",
        ),
    ),
    Family(
        module="deepseek_v31",
        members=(
            Member(
                name="deepseek-v3.1-vllm-tools",
                marks=("<｜Assistant｜>", "<｜tool▁sep｜>", _DEEPSEEK_VLLM_TOOLS),
                template="deepseek_v3.1_vllm",
            ),
        ),
        readme=ReadmeRow(
            note="DeepSeek-V3.1 with vLLM's reworked template, which lists the tools",
            golden="24 / 24 (generated from vLLM's template)",
            jinja="792 (198 conversations x 2 variants x gen prompt; 158 of them with tools) + 168 renders refused as "
            "the template fails (a tool without description or parameters, null content)",
            parser="`deepseek_v31` tool parser + `deepseek_v31` reasoning (as `deepseek-v3.1`)",
            tito="token level, official DeepSeek-V3 `tokenizer.json`, through `AgentSession`",
            seams="the template's indentation reaches the prompt: the generation prompt's spaces differ from "
            "history's before `<｜Assistant｜>`, `</think>`, content and calls; thinking as `deepseek-v3.1`",
        ),
    ),
    Family(
        module="deepseek_v32",
        members=(
            # no chat template to detect: DeepSeek-V3.2 ships a Python encoder (encoding/encoding_dsv32.py)
            Member(name="deepseek-v3.2", model_types=("deepseek_v32",)),
        ),
        readme=ReadmeRow(
            note="DeepSeek-V3.2's DSML format; no Jinja template: the official Python encoder is the reference. "
            "V3.2-Exp, which kept V3.1's call format, is not covered",
            golden="20 / 24 (generated from the official encoder, tests/data/golden/deepseek_v3.2; 6 cases x thinking "
            "x 2 tools placements), and the 4 it refuses (thinking mode, a final answer without reasoning) raise",
            jinja="no template: 576 of 680 generated conversations (307 chat, 269 thinking; 472 with tools) equal "
            "to the encoder's renders with each tools placement (DeepSeek's/SGLang's, vLLM's), the 104 it refuses "
            "refused",
            parser='`deepseek_v32` tool parser (DSML `invoke`/`parameter`, `string="false"` values as JSON) + R1 '
            "reasoning in thinking mode",
            tito="token level, DeepSeek-V3 `tokenizer.json` with V3.1's `<think>`/`</think>` tokens (V3.2's own "
            "file is not in a registry here; DSML is text), through `AgentSession`",
            seams="none in chat mode; thinking mode: a new user message drops earlier reasoning and turns their "
            "`<think>` openers into `</think>`",
        ),
    ),
    Family(
        module="glm45",
        members=(
            Member(
                name="glm-4.5",
                marks=("[gMASK]<sop>", "<arg_key>"),
                absent=(_GLM46, "clear_thinking"),
                model_types=("glm4_moe",),
                template="glm4.5",
            ),
        ),
        readme=ReadmeRow(
            golden="24 / 24",
            jinja="640 (160 x 2 variants x gen prompt, also with string arguments)",
            parser="`glm45` tool parser (`<arg_key>`/`<arg_value>`; a string-typed parameter of the episode's tools "
            "kept raw (`with_tools`), other values JSON then Python literal) + `glm45` reasoning",
            tito="text level (no GLM tokenizer here): a byte-level tokenizer with GLM's control tokens, through "
            "`AgentSession`",
            seams="the role token that ends a turn is sampled, and a wrong one is kept with the right one written "
            "after it; reasoning dropped after a new user message",
        ),
    ),
    Family(
        module="glm45",
        members=(
            Member(
                name="glm-4.6",
                marks=("[gMASK]<sop>", "<arg_key>", _GLM46),
                absent=("clear_thinking",),
                template="glm4.6",
            ),
        ),
        readme=ReadmeRow(
            golden="24 / 24 (generated from the official template)",
            jinja="640 (160 x 2 variants x gen prompt, also with string arguments)",
            parser="as `glm-4.5`: `glm45` tool parser typed by the episode's tool schemas (`with_tools`) + `glm45` "
            "reasoning",
            tito="text level (no GLM tokenizer in a registry): a byte-level tokenizer with GLM's control tokens, "
            "through `AgentSession`",
            seams="as `glm-4.5`",
            note="template: a llama.cpp copy, not byte-verified against zai-org/GLM-4.6",
        ),
    ),
    Family(
        module="glm47",
        members=(Member(name="glm-4.7", marks=("[gMASK]<sop>", "<arg_key>", *_GLM47), template="glm4.7"),),
        readme=ReadmeRow(
            golden="36 / 36 (generated from the official template)",
            jinja="960 (160 x 3 variants x gen prompt, also with string arguments)",
            parser="`glm47` tool parser (the name ends at the first `<arg_key>`; a string-typed parameter of the "
            "episode's tools kept raw (`with_tools`), other values JSON then Python literal) + `glm45` reasoning",
            tito="text level (no GLM tokenizer in a registry): a byte-level tokenizer with GLM's control tokens, "
            "through `AgentSession`",
            seams="GLM-4.5's role-token seams; thinking on, a turn without reasoning is `<think></think>` generated vs "
            "`</think>` in history; reasoning dropped after a new user message unless `clear_thinking=False`",
            note="template: GLM-4.7-Flash's as llama.cpp ships it, equal to GLM-4.7's as far as a mirror shows it",
        ),
    ),
    Family(
        module="gpt_oss",
        members=(
            Member(name="gpt-oss", marks=("<|channel|>", "<|call|>"), model_types=("gpt_oss",), template="gpt_oss"),
        ),
        readme=ReadmeRow(
            golden="12 / 12",
            jinja="1,280 (160 x 4 tool sets x gen prompt) + 450 (`reasoning_effort`) + 300 schemas + 300 with refusals",
            parser="`openai` (harmony) tool parser: analysis and preambles are reasoning, `to=functions.NAME` a call, "
            "the last `final` the content",
            tito="token level, official o200k_harmony `tokenizer.json`, through `AgentSession`",
            seams="a sampled `<\\|return\\|>` is `<\\|end\\|>` in history; analysis dropped once a later final answer "
            "exists",
        ),
    ),
    Family(
        module="mistral",
        members=(
            Member(
                name="mistral-v0.3",
                marks=("[TOOL_CALLS]", "[AVAILABLE_TOOLS]"),
                absent=("[ARGS]",),
                template="mistral_v0.3",
            ),
            Member(name="mistral-small-3.2", marks=("[TOOL_CALLS]", "[ARGS]"), template="mistral_small_3.2"),
        ),
        readme=ReadmeRow(
            golden="24 / 24",
            jinja="398 + 370 equal, 82 + 110 refusals matched (240 conversations each)",
            parser="`mistral`: the JSON list (v0.3) and `name[CALL_ID]id[ARGS]{json}` (v11+); 9-character call ids",
            tito="`mistral-v0.3`: token level, Mistral's v3 SentencePiece tokenizer (mistral-common's, converted to "
            "`tokenizer.json`; its ids equal mistral-common's on the golden conversations), through `AgentSession`; "
            "`mistral-small-3.2`: text level (no tokenizer with `[CALL_ID]`/`[ARGS]` in a registry): a byte-level "
            "tokenizer with Mistral's control tokens, through `AgentSession`",
            seams="`[AVAILABLE_TOOLS]` stays before the first user message (the template moves it to the last); "
            "v0.3's system text only in the prompt",
        ),
    ),
    Family(
        module="gemma3",
        members=(
            Member(
                name="gemma3",
                marks=("<start_of_turn>", "first_user_prefix", "<start_of_image>"),
                absent=("audio", "tool"),
                model_types=("gemma3", "gemma3_text"),
                template="gemma3_it",
            ),
        ),
        readme=ReadmeRow(
            golden="12 / 12 (generated from the official template): 6 renders equal (`tools_provided` with a "
            "warning: the template drops the tool list), the 6 the template refuses (roles must alternate) refused",
            jinja="800 (400 conversations x gen prompt: system text as a string or a part, text-part lists, null "
            "content, roles out of turn, system turns where a model turn stands): 200 without tools, 294 equal and "
            "106 refusals matched; 200 with tools, tool calls and tool messages, 268 equal and 132 refusals matched",
            parser="plain content: vLLM has no tool or reasoning parser for this template",
            tito="token level, official Gemma 3 `tokenizer.json`, golden cases id for id and through `AgentSession` "
            "(with tools: the prompt shows none)",
            seams="a turn's content is trimmed in history (a generated turn with outer whitespace re-renders "
            "without it); no tool format: the tool list and calls dropped, a tool message a `tool` turn, with a "
            "`TemplateGapWarning`; a turn with calls cannot be generated; images refused",
            note="google/gemma-3-*-it",
        ),
    ),
    Family(
        module="gemma3_pythonic",
        members=(
            Member(
                name="gemma3-vllm-pythonic",
                marks=("<start_of_turn>", "Tools (functions) are available", "<tool_response>"),
                template="gemma3_vllm_pythonic",
            ),
        ),
        readme=ReadmeRow(
            golden="12 / 12 (generated from vLLM's template)",
            jinja="400 (200 conversations x gen prompt: every tool shape, an empty tool list, parallel calls, tool "
            "results, null content, roles out of turn): 266 equal, 134 refusals matched",
            parser="`pythonic` (vLLM): a Python list of calls with literal keyword arguments, read with `ast` (never "
            "evaluated); a turn that starts like one and cannot be read is a broken call with a coded issue",
            tito="token level, official Gemma 3 `tokenizer.json`, through `AgentSession` with tools",
            seams="the template writes no `, ` between a call's arguments and spells booleans and nulls in JSON "
            "(`f(a=1b=true)`), where the model writes what the parser reads (`f(a=1, b=True)`); a turn's content is "
            "trimmed in history; negative numbers cannot be generated (vLLM's parser reads none)",
            note="google/gemma-3-*-it; vLLM's own tool template, not official",
        ),
    ),
    Family(
        module="nemotron",
        members=(
            Member(
                name="nemotron-nano-v2",
                marks=("<SPECIAL_11>Assistant", "<TOOLCALL>", "/no_think", "<AVAILABLE_TOOLS>"),
                template="nemotron_nano_v2",
            ),
        ),
        readme=ReadmeRow(
            golden="12 / 12 (generated from the official template)",
            jinja="1,200 (300 conversations x 2 variants x gen prompt, every tool shape): 352 + 302 equal, 144 "
            "refusals the template raises matched, 402 refused here (a later system message, which the template drops; "
            "null tool content; a switch against `enable_thinking`)",
            parser="NVIDIA's `nemotron_json` tool parser (the vLLM plugin shipped with the model: the first "
            "`<TOOLCALL>` JSON list; vLLM has none of its own) + `deepseek_r1` reasoning with thinking on",
            tito="text level (no Nemotron tokenizer in a registry here): a byte-level tokenizer with the "
            "template's control tokens, through `AgentSession`",
            seams="a generated turn's think part (`<think>\\n\\n`, reasoning, `</think>`; `<think></think>` with "
            "thinking off) is never in history; content stripped in history; a conversation ending on a turn renders "
            "it otherwise (a think opener, its calls as a turn of their own)",
            note="nvidia/NVIDIA-Nemotron-Nano-9B-v2; Llama-3.3-Nemotron-Super-49B-v1.5 is `nemotron-super-v1.5`",
        ),
    ),
    Family(
        module="nemotron3",
        members=(
            Member(
                name="nemotron-3-nano",
                marks=(_IM, "truncate_history_thinking", "<tool_call>", "render_extra_keys"),
                template="nemotron3_nano",
            ),
        ),
        readme=ReadmeRow(
            golden="12 / 12 (generated from the official template)",
            jinja="1,280 (160 conversations x 4 variants (`enable_thinking` x `truncate_history_thinking`) x gen "
            "prompt, every tool shape): 1,160 equal, 120 refused here (null user or tool content, which the template "
            "prints as `None`)",
            parser="`qwen3_coder` (typed by the episode's tool schemas, `with_tools`) + NVIDIA's `nano_v3` reasoning "
            "(`deepseek_r1`, content when thinking is off)",
            tito="text level (no Nemotron tokenizer in a registry here): a byte-level tokenizer with the "
            "template's control tokens, through `AgentSession`",
            seams="reasoning before the last user message dropped (`truncate_history_thinking`, on by default; a "
            "one-query episode is append-only); empty reasoning generated as `\\n</think>\\n`, `<think></think>` in "
            "history; content and reasoning trimmed in history",
            note="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B",
        ),
    ),
    Family(
        module="nemotron_super",
        members=(
            Member(
                name="nemotron-super-v1.5",
                marks=("<|start_header_id|>", "<TOOLCALL>", "/no_think", "<AVAILABLE_TOOLS>"),
                template="nemotron_super_v1_5",
            ),
        ),
        readme=ReadmeRow(
            golden="12 / 12 (generated from the official template)",
            jinja="800 (200 conversations x 2 variants (`enable_thinking`; the off one with `/no_think` in its system "
            "prompt) x gen prompt, every tool shape): 292 + 338 equal, 24 refusals the template raises matched (null "
            "assistant or first system content), 100 refused here (a later system message, which the template drops; "
            "null user or tool content, which it prints as `None`), 46 a switch against `enable_thinking`",
            parser="NVIDIA's `llama_nemotron_json` tool parser (the vLLM plugin the model card serves it with: the "
            "first `<TOOLCALL>` JSON list; vLLM has none of its own) + `deepseek_r1` reasoning with thinking on",
            tito="token level with the Llama 3.1 tokenizer as a stand-in (Llama 3's vocabulary; the template's "
            "`<\\|begin_of_text\\|>`, header and `<\\|eot_id\\|>` tokens checked to be its added tokens with Llama "
            "3.1's ids; `<TOOLCALL>` and `<think>` are text in it; Super v1.5's own `tokenizer.json` is not in a "
            "registry here), golden renders and through `AgentSession`",
            seams="thinking on: a generated turn's `<think>`reasoning`</think>` is never in history (the template "
            "keeps an assistant turn's text after its last `</think>`); thinking off: the generation prompt's empty "
            "`<think></think>` block is in the transcript only; the mode is read from the first system message only",
            note="nvidia/Llama-3_3-Nemotron-Super-49B-v1_5; the v1 models (Llama-3.1-Nemotron-Nano-8B-v1, "
            "Llama-3.3-Nemotron-Super-49B-v1) are not covered: their templates differ (no tool list, content trimmed)",
        ),
    ),
    Family(
        module="kimi_k2",
        members=(
            Member(
                name="kimi-k2",
                marks=(_KIMI_TOOLS, "You are a helpful assistant<|im_end|>"),
                absent=("<|tool_calls_section_begin|>", "<think>"),
                template="kimi_k2_instruct",
            ),
            Member(
                name="kimi-k2-thinking",
                marks=(_KIMI_TOOLS, "<think>{{rc}}</think>", "## Return of", "last_non_tool_call_assistant_msg"),
                absent=("tool_response_queue", "tools_ts_str", "preserve_thinking"),
                template="kimi_k2_thinking",
            ),
        ),
        readme=ReadmeRow(
            note="moonshotai/Kimi-K2-Instruct as released (July 2025), Kimi-K2-Thinking",
            golden="24 / 24 (generated from the official templates)",
            jinja="680 (170 conversations x 2 templates x gen prompt, with every tool shape, names, text-part lists "
            "and Kimi call ids): Thinking 340 equal; Instruct 306 equal and 34 refusals matched (null content)",
            parser="`kimi_k2` tool parser (`<\\|tool_calls_section_begin\\|>`, call ids `functions.NAME:IDX` kept as "
            "written, the name read from the id) + `kimi_k2` reasoning for Thinking (`</think>` or the call section "
            "ends it)",
            tito="text level (no Kimi tokenizer in a registry: Kimi ships a tiktoken file): a byte-level tokenizer "
            "with Kimi's control tokens, through `AgentSession`",
            seams="`kimi-k2`: its template renders no tool calls, call ids or reasoning in history, so a sampled call "
            "section is in the transcript only (`CallsNotRenderedWarning`, once per protocol object); "
            "`kimi-k2-thinking`: every turn up to the last final answer re-rendered with an empty `<think></think>`",
        ),
    ),
    Family(
        module="minimax_m2",
        members=(
            Member(
                name="minimax-m2",
                marks=("]~b]ai", "<minimax:tool_call>", "ns.last_user_index"),
                model_types=("minimax_m2",),
                template="minimax_m2",
            ),
        ),
        readme=ReadmeRow(
            note="MiniMaxAI/MiniMax-M2; M2.1 absent: its template differs and was found only in part",
            golden="12 / 12 (generated from the official template)",
            jinja="680 (170 conversations x gen prompt x arguments as objects and as JSON strings, tools in 3 of "
            "5): 488 equal, 192 refused as the template refuses; + 80 with null tool results",
            parser="`minimax_m2` tool parser, values typed by the request's tool schemas (`with_tools`), + "
            "`minimax_m2` reasoning",
            tito="text level (no MiniMax tokenizer in a registry here): a byte-level tokenizer with MiniMax's "
            "control tokens, through `AgentSession`",
            seams="a turn written with empty reasoning keeps `<think>` / `</think>` (the template renders no "
            "block); reasoning before a later user message dropped by the template, kept here",
        ),
    ),
]


def family_table() -> tuple[Family, ...]:
    """Every family, built-in and registered, in table order."""
    return tuple(_TABLE)


def family_of(name: str) -> Family | None:
    """The family that registers `name`, or None."""
    return next((family for family in _TABLE if name in family.names), None)


def register_family(family: Family, *, replace: bool = False) -> None:
    """Add `family` to the table (after the built-in ones, so detection tries it last): its names become
    registered protocols, its marks detectable. A name already in the table is refused unless `replace`, which
    first drops the families that hold any of its names."""
    taken = [f for f in _TABLE if set(f.names) & set(family.names)]
    if taken and not replace:
        names = sorted(set(family.names) & {n for f in taken for n in f.names})
        raise ValueError(f"model family name(s) {', '.join(names)} already in the table; pass replace=True")
    for old in taken:
        _TABLE.remove(old)
    _TABLE.append(family)


def unregister_family(family: Family) -> None:
    """Take `family` out of the table again (a test's clean-up)."""
    _TABLE.remove(family)


def _names_cell(names: tuple[str, ...], options: Callable[[str], list[str]], note: str) -> str:
    """`a`, `b` (`opt`): names, each run of names that take the same options followed by those options."""
    groups: list[tuple[list[str], list[str]]] = []
    for name in names:
        taken = options(name)
        if groups and groups[-1][1] == taken:
            groups[-1][0].append(name)
        else:
            groups.append(([name], taken))
    parts = []
    for group, taken in groups:
        text = ", ".join(f"`{n}`" for n in group)
        parts.append(text + (f" ({', '.join(f'`{o}`' for o in taken)})" if taken else ""))
    return ", ".join(parts) + (f" ({note})" if note else "")


def readme_table(options: Callable[[str], list[str]] | None = None) -> str:
    """The package README's family table, in Markdown, from this table (`options(name)`: the options a name takes;
    by default `protocol_options`, which imports each family module)."""
    if options is None:
        from agent_protocol.registry import protocol_options

        options = protocol_options
    lines = [
        "| name (options) | golden renders exact | generated vs official Jinja | parser semantics (vLLM) "
        "| token-in-token-out | known seams (the transcript keeps what was sampled) |",
        "|---|---|---|---|---|---|",
    ]
    for family in _TABLE:
        row = family.readme
        if row is None:
            continue
        cells = (_names_cell(family.names, options, row.note), row.golden, row.jinja, row.parser, row.tito, row.seams)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
