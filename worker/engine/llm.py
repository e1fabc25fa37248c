"""Offline generation, like vLLM's ``LLM``: a list of prompts in, outputs in input order."""

from __future__ import annotations

import operator
from collections.abc import Sequence as Seq
from typing import Any

from tqdm import tqdm

from worker.engine.config import EngineArgs
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import RequestOutput
from worker.protocol.sampling_params import InvalidRequestError, SamplingParams


def _token_ids(prompt: Seq[Any]) -> list[int]:
    """Token ids as Python ints (numpy and torch integers accepted); anything else is refused."""
    try:
        if any(isinstance(t, bool) for t in prompt):
            raise TypeError
        return [operator.index(t) for t in prompt]
    except TypeError:
        raise InvalidRequestError("prompt token ids must be integers") from None

Prompt = str | list[int]


class LLM:
    """``LLM(model="smollm2-135m", **engine_args).generate(prompts, SamplingParams(...))``."""

    def __init__(self, model: str = "smollm2-135m", **engine_args: Any) -> None:
        self.engine = LLMEngine(EngineArgs(model=model, **engine_args))
        self._counter = 0

    @property
    def tokenizer(self):
        """The model's Hugging Face tokenizer."""
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for each prompt (a string or token ids); outputs in input order."""
        single = isinstance(prompts, str) or (bool(prompts) and isinstance(prompts[0], int))
        batch: list[Any] = [prompts] if single else list(prompts)
        encoded: list[tuple[str | None, list[int]]] = []
        for p in batch:
            if isinstance(p, str):
                encoded.append((p, self.engine.tokenize(prompt=p)))
            else:
                encoded.append((None, _token_ids(p)))
        return self._run(encoded, sampling_params, use_tqdm)

    def chat(
        self,
        conversations: list[dict] | Seq[list[dict]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to chat conversations through the model's chat template."""
        single = bool(conversations) and isinstance(conversations[0], dict)
        batch: list[Any] = [conversations] if single else list(conversations)
        encoded: list[tuple[str | None, list[int]]] = [
            (None, self.engine.tokenize(messages=list(c))) for c in batch
        ]
        return self._run(encoded, sampling_params, use_tqdm)

    def _run(
        self,
        encoded: list[tuple[str | None, list[int]]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None,
        use_tqdm: bool,
    ) -> list[RequestOutput]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(encoded)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(encoded):
                raise ValueError(f"{len(params_list)} sampling params for {len(encoded)} prompts")
        ids = []
        for (text, token_ids), params in zip(encoded, params_list, strict=True):
            request_id = str(self._counter)
            self._counter += 1
            self.engine.add_request(request_id, token_ids, params, prompt=text)
            ids.append(request_id)
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="generate", disable=not use_tqdm, unit="req")
        generated = 0
        while self.engine.has_unfinished_requests():
            outputs, _ = self.engine.step()
            generated += sum(len(o.new_token_ids) for o in outputs)
            for out in outputs:
                if out.finished:
                    finished[out.request_id] = out
                    bar.update(1)
            bar.set_postfix(tok_s=f"{generated / max(bar.format_dict['elapsed'], 1e-9):.1f}")
        bar.close()
        return [finished[i] for i in ids]
