"""Chat templates from the model's own tokenizer files, rendered without transformers.

A chat template is a Jinja2 program shipped with the tokenizer (in
``tokenizer_config.json``, ``chat_template.jinja`` or the GGUF field
``tokenizer.chat_template``). It is rendered the way Hugging Face
transformers' ``apply_chat_template(..., tokenize=False)`` renders it: a
sandboxed environment with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension, a ``tojson`` filter that does not escape HTML or
non-ASCII, ``raise_exception`` and ``strftime_now`` globals, and the
variables ``messages``, ``add_generation_prompt``, ``tools``, ``documents``
plus the tokenizer's special tokens (``bos_token``, ``eos_token``, ...).
Templates are untrusted code from a model hub, hence the sandbox.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.sandbox

# Special-token names transformers passes to a template (its special_tokens_map).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class ChatTemplateError(ValueError):
    """A template that cannot be found, compiled or rendered for these messages."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for loss masks
    in transformers; when only rendering text it outputs its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationBlock]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    try:
        return environment.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc.message} (line {exc.lineno})") from exc


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    bos_token: str = "",
    eos_token: str = "",
    **variables: Any,
) -> str:
    """Render ``messages`` ([{"role": ..., "content": ...}, ...]) with a chat template.

    ``add_generation_prompt`` appends the header that opens the assistant's
    turn (what a prompt for sampling needs). Extra keyword ``variables``
    (other special tokens, ``tools``, template switches such as
    ``enable_thinking``) are passed to the template as is.
    """
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise ChatTemplateError(f"message {index} must be a mapping with a 'role', got {message!r:.100}")
    context = {"tools": None, "documents": None, **variables}
    try:
        return _compile(template).render(
            messages=[dict(message) for message in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **context,
        )
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed on these messages: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A tokenizer's chat template with the special tokens it refers to."""

    template: str
    special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def render(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **variables: Any
    ) -> str:
        return render_chat_template(
            self.template, messages, add_generation_prompt=add_generation_prompt, **{**self.special_tokens, **variables}
        )

    def render_prompt(self, user_text: str, *, system: str | None = None, **variables: Any) -> str:
        """The sampling prompt for one user turn (optionally after a system turn)."""
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": user_text}
        ]
        return self.render(messages, add_generation_prompt=True, **variables)

    @classmethod
    def from_hf_dir(cls, directory: str | os.PathLike) -> "ChatTemplate":
        """From a Hugging Face tokenizer directory.

        The template is ``chat_template.jinja`` if present (newer
        transformers save it there), else ``tokenizer_config.json``'s
        ``chat_template`` (a string, or a list of named templates of which
        "default" is taken). Special tokens come from tokenizer_config.json,
        then special_tokens_map.json.
        """
        directory = Path(directory)
        config_path = directory / "tokenizer_config.json"
        config = _read_json(config_path) if config_path.exists() else {}
        jinja_path = directory / "chat_template.jinja"
        if jinja_path.exists():
            template = jinja_path.read_text(encoding="utf-8")
        elif "chat_template" in config:
            template = _pick_default_template(config["chat_template"], config_path)
        else:
            raise ChatTemplateError(
                f"no chat template in {directory}: expected chat_template.jinja or a 'chat_template' "
                "field in tokenizer_config.json"
            )
        map_path = directory / "special_tokens_map.json"
        token_map = _read_json(map_path) if map_path.exists() else {}
        special_tokens = {}
        for name in SPECIAL_TOKEN_NAMES:
            token = _token_text(config.get(name)) or _token_text(token_map.get(name))
            if token:
                special_tokens[name] = token
        return cls(template=template, special_tokens=special_tokens)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "ChatTemplate":
        """From a GGUF file's ``tokenizer.chat_template`` and bos/eos token ids."""
        import gguf

        reader = gguf.GGUFReader(str(path))
        template_field = reader.fields.get("tokenizer.chat_template")
        if template_field is None:
            raise ChatTemplateError(f"{path} has no tokenizer.chat_template field")
        tokens = reader.fields["tokenizer.ggml.tokens"]
        special_tokens = {}
        for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                          ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
            field = reader.fields.get(f"tokenizer.ggml.{key}")
            if field is not None:
                special_tokens[name] = _gguf_string_item(tokens, int(field.contents()))
        return cls(template=template_field.contents(), special_tokens=special_tokens)


def _gguf_string_item(field, index: int) -> str:
    """Item ``index`` of a GGUF string-array field, decoding only that item
    (``field.contents()`` decodes all 49k tokens, seconds of work)."""
    return bytes(field.parts[field.data[index]]).decode("utf-8")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ChatTemplateError(f"{path}: malformed JSON ({exc})") from exc


def _pick_default_template(value: Any, source: Path) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
        raise ChatTemplateError(f"{source}: chat_template list has no 'default' entry (names: {sorted(named)})")
    raise ChatTemplateError(f"{source}: chat_template must be a string or a list, got {type(value).__name__}")


def _token_text(token: Any) -> str | None:
    """A special token as stored by HF: a string, or an AddedToken dict with 'content'."""
    if isinstance(token, str):
        return token
    if isinstance(token, dict) and isinstance(token.get("content"), str):
        return token["content"]
    return None
