"""Tokenization and validation of requests, for the tokenizer manager.

`RequestTokenizer` turns the `ReqInput`s of a call into `TokenizedGenerateReq`s for the scheduler
(rendering a chat's messages with the model's chat template first), or raises `RequestError`
naming what is wrong (and the field, as the native API names it), so that a bad request is
refused before anything of its call is sent. With `generate_req_input.expand`, this is the one
place user-facing request errors come from: the native API, the OpenAI API (whose
`openai_protocol` only maps names) and the Engine all pass through it. The scheduler keeps only
the checks only it can make (a request id in flight, KV room).

It reads the model through `srt.model_info` and tokenizes with `hf_tokenizer.Tokenizer`: no
torch, no transformers in this process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from srt.chat_template import ChatTemplateError
from srt.io_struct import TokenizedGenerateReq
from srt.managers.generate_req_input import ReqInput
from srt.managers.hf_tokenizer import Tokenizer, load_tokenizer
from srt.model_info import ModelInfo
from srt.request_limits import RequestError
from srt.sampling_params import SamplingParams
from srt.server_args import ServerArgs


class RequestTokenizer:
    """The model's tokenizer plus the limits a request must fit: its context length and the ids
    it can embed."""

    def __init__(self, server_args: ServerArgs) -> None:
        if server_args.model_path is None:
            raise ValueError("the tokenizer manager needs --model-path")
        self.tokenizer: Tokenizer = load_tokenizer(server_args)
        info = ModelInfo.read(
            server_args.model_path,
            context_length=server_args.context_length,
            trust_remote_code=server_args.trust_remote_code,
        )
        self.context_length = info.context_length
        # Ids the model can embed and the detokenizer can decode.
        self.vocab_size = min(len(self.tokenizer), info.vocab_size)

    def tokenize(self, reqs: list[ReqInput]) -> list[TokenizedGenerateReq]:
        """Tokenized, validated requests (RequestError for the first bad one)."""
        texts = sorted({r.text for r in reqs if r.text is not None})
        encoded = self.tokenizer.encode_batch(texts) if texts else []
        ids_of = dict(zip(texts, encoded, strict=True))
        chats: dict[int, list[int]] = {}  # the samples of one chat share its messages: render once
        out = []
        for req in reqs:
            if req.input_ids is not None:
                ids = req.input_ids
                self.check_ids(ids, "input_ids")
            elif req.messages is not None:
                if id(req.messages) not in chats:
                    chats[id(req.messages)] = self.render_chat(req.messages, req.tools)
                ids = chats[id(req.messages)]
            else:
                assert req.text is not None
                ids = ids_of[req.text]
            out.append(self.build_req(req, ids))
        return out

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """The prompt ids of a chat (offered `tools`). The template's text is tokenized without
        adding special tokens: a template that writes the BOS itself must not get a second
        one."""
        if self.tokenizer.chat_template is None:
            raise RequestError(
                "the model has no chat template: use /v1/completions with a prompt", "messages"
            )
        try:
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tools=tools
            )
        except ChatTemplateError as e:
            raise RequestError(f"the chat template refused the messages: {e}", "messages") from e
        return self.tokenizer.encode(text, add_special_tokens=False)

    def build_req(self, req: ReqInput, ids: list[int]) -> TokenizedGenerateReq:
        """The scheduler's message for `req` with prompt `ids`; RequestError if it cannot fit."""
        prompt = "text" if req.text is not None else "input_ids"
        if req.messages is not None:
            prompt = "messages"
        if not ids or req.text == "":
            raise RequestError("the prompt is empty", prompt)
        kwargs = dict(req.sampling_kwargs)
        if kwargs.get("max_new_tokens", 0) is None:
            kwargs["max_new_tokens"] = max(self.context_length - len(ids), 0)
        try:
            params = SamplingParams(**kwargs)
        except RequestError as e:
            raise e.within("sampling_params") from e
        self.check_ids(params.stop_token_ids, "sampling_params.stop_token_ids")
        self.check_ids([token for token, _ in params.logit_bias], "sampling_params.logit_bias")
        total = len(ids) + params.max_new_tokens
        if len(ids) >= self.context_length:
            raise RequestError(
                f"the prompt has {len(ids)} tokens, which leaves no room for output in the "
                f"context length of {self.context_length} tokens",
                prompt,
            )
        if req.logprob_start_len >= len(ids):
            raise RequestError(
                f"logprob_start_len ({req.logprob_start_len}) must be below the prompt length "
                f"({len(ids)} tokens)",
                "logprob_start_len",
            )
        if total > self.context_length:
            raise RequestError(
                f"the prompt has {len(ids)} tokens and max_new_tokens is "
                f"{params.max_new_tokens}: {total} tokens exceed the context length of "
                f"{self.context_length} tokens",
                "sampling_params.max_new_tokens",
            )
        return TokenizedGenerateReq(
            rid=req.rid,
            input_ids=tuple(ids),
            sampling_params=params,
            stream=req.stream,
            return_logprob=req.return_logprob,
            top_logprobs_num=req.top_logprobs_num,
            logprob_start_len=req.logprob_start_len,
        )

    def check_ids(self, ids: list[int] | tuple[int, ...], what: str) -> None:
        """RequestError (for field `what`) if `ids` hold an id outside the vocabulary."""
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise RequestError(
                f"{what} holds token id {bad}, outside the vocabulary [0, {self.vocab_size})", what
            )
