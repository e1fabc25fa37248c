"""Exact prompt tokens in the API process, without torch or transformers (the import
contracts keep both out of the API): the served model's ``tokenizer.json`` through the
``tokenizers`` library, and its chat template rendered with jinja2 as transformers'
``apply_chat_template`` renders it (a sandboxed environment, ``trim_blocks`` and
``lstrip_blocks``, the loop controls, its ``tojson``, ``raise_exception`` and
``strftime_now``, the special tokens as variables, the generation prompt added), then
encoded without special tokens, as the worker's ``request_validation.tokenize`` does. A
test holds the two equal token for token (``tests/api/test_estimates.py``).

The checkpoint is ``INFLIGHT_TOKENIZER``: a ``--model`` spec whose checkpoint is on this
machine (``smollm2-135m`` once a worker here converted it, ``tiny-<arch>``, a checkpoint
directory; ``worker.engine.models.checkpoint_dirs``). Where there is none, or it has no
``tokenizer.json``, the counts fall back to the strict upper bound the limits use (one
token per UTF-8 byte, ``api.limits.prompt_token_bound``), and say they are not exact."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from api.limits import prompt_token_bound
from worker.engine.models.checkpoint_dirs import checkpoint_dir
from worker.protocol.openai_batch import GenerationRequest

log = logging.getLogger(__name__)


class PromptCounter:
    """Counts the prompt tokens of parsed requests (thread-safe once loaded)."""

    def __init__(self, spec: str | None) -> None:
        self.spec = spec
        self._lock = threading.Lock()
        self._loaded = False
        self._tokenizer: Any = None
        self._template: Any = None
        self._specials: dict[str, str] = {}

    @property
    def exact(self) -> bool:
        """Whether counts come from the model's tokenizer (else: the upper bound)."""
        self._load()
        return self._tokenizer is not None

    def count(self, reqs: Sequence[GenerationRequest]) -> list[int]:
        """The prompt tokens of each request: exact for token-id prompts, and for text and
        chat prompts when the tokenizer is loaded; else the upper bound."""
        self._load()
        out = [len(r.prompt) if isinstance(r.prompt, list) else 0 for r in reqs]
        texts: list[str] = []
        where: list[int] = []
        for i, r in enumerate(reqs):
            if isinstance(r.prompt, list):
                continue
            text = self._text(r)
            if text is None:
                out[i] = prompt_token_bound(r)
            else:
                texts.append(text)
                where.append(i)
        if texts:
            encoded = self._tokenizer.encode_batch(texts, add_special_tokens=False)
            for i, enc in zip(where, encoded, strict=True):
                out[i] = len(enc.ids)
        return out

    def _text(self, req: GenerationRequest) -> str | None:
        """What the tokenizer encodes: the prompt, or the rendered chat template; None
        when it cannot be had here (no tokenizer, no template, a template that refuses)."""
        if self._tokenizer is None:
            return None
        if req.messages is None:
            return req.prompt if isinstance(req.prompt, str) else None
        if self._template is None:
            return None
        try:
            return str(self._template.render(messages=req.messages, tools=None, documents=None,
                                             add_generation_prompt=True, **self._specials))
        except Exception:  # the worker refuses it too: counted by the bound
            return None

    def _load(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if not self._loaded:
                self._tokenizer, self._template, self._specials = _read(self.spec)
                self._loaded = True


def _read(spec: str | None) -> tuple[Any, Any, dict[str, str]]:
    """The tokenizer, the compiled chat template and the special tokens of ``spec``'s
    checkpoint; (None, None, {}) when there is none here (logged once)."""
    if not spec:
        return None, None, {}
    try:
        where = checkpoint_dir(spec)
    except Exception as exc:
        log.warning("INFLIGHT_TOKENIZER=%s: %s; prompt tokens are estimated by their bound",
                    spec, exc)
        return None, None, {}
    if where is None or not (where / "tokenizer.json").is_file():
        log.warning("INFLIGHT_TOKENIZER=%s: no tokenizer.json at %s (a worker on this machine "
                    "writes it when it first loads the model); prompt tokens are estimated by "
                    "their bound", spec, where)
        return None, None, {}
    from tokenizers import Tokenizer

    config = _json(where / "tokenizer_config.json")
    template = _chat_template(where, config)
    specials = {k: v["content"] if isinstance(v, dict) else v for k, v in config.items()
                if k.endswith("_token") and isinstance(v, (str, dict))}
    compiled = None
    if template:
        try:
            compiled = _compile(template)
        except Exception as exc:  # a tag transformers' own environment adds, say
            log.warning("INFLIGHT_TOKENIZER=%s: the chat template does not compile here (%s); "
                        "chat prompts are estimated by their bound", spec, type(exc).__name__)
    return (Tokenizer.from_file(str(where / "tokenizer.json")), compiled,
            {k: v for k, v in specials.items() if isinstance(v, str)})


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _chat_template(where: Path, config: dict[str, Any]) -> str | None:
    """The checkpoint's chat template: ``chat_template.jinja``, else the tokenizer
    config's (its ``default`` one when it names several)."""
    if (where / "chat_template.jinja").is_file():
        return (where / "chat_template.jinja").read_text(encoding="utf-8")
    found = config.get("chat_template")
    if isinstance(found, list):
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        found = named.get("default")
    return found if isinstance(found, str) else None


def _compile(template: str) -> Any:
    """The template compiled as transformers compiles chat templates."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
