"""Tokenization and validation of requests, for the tokenizer manager.

`RequestTokenizer` turns the `ReqInput`s of a call into `TokenizedGenerateReq`s for the scheduler,
or raises `RequestError` naming what is wrong (and the field, as the native API names it), so
that a bad request is refused before anything of its call is sent. The scheduler checks again
(it may get requests from elsewhere), but the messages here are the ones a client sees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from srt.io_struct import TokenizedGenerateReq
from srt.managers.generate_req_input import ReqInput
from srt.managers.hf_tokenizer import load_tokenizer
from srt.model_executor.model_config import ModelConfig
from srt.request_limits import RequestError
from srt.sampling_params import SamplingParams
from srt.server_args import ServerArgs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class RequestTokenizer:
    """The model's tokenizer plus the limits a request must fit: its context length and the ids
    it can embed."""

    def __init__(self, server_args: ServerArgs) -> None:
        if server_args.model_path is None:
            raise ValueError("the tokenizer manager needs --model-path")
        self.tokenizer: PreTrainedTokenizerBase = load_tokenizer(server_args)
        config = ModelConfig.load(
            server_args.model_path,
            server_args.dtype,
            torch.device("cpu"),
            context_length=server_args.context_length,
            trust_remote_code=server_args.trust_remote_code,
        )
        self.context_length = config.context_length
        # Ids the model can embed and the detokenizer can decode.
        self.vocab_size = min(len(self.tokenizer), config.vocab_size)

    def tokenize(self, reqs: list[ReqInput]) -> list[TokenizedGenerateReq]:
        """Tokenized, validated requests (RequestError for the first bad one)."""
        texts = sorted({r.text for r in reqs if r.text is not None})
        encoded = self.tokenizer(texts)["input_ids"] if texts else []
        ids_of = dict(zip(texts, encoded, strict=True))
        out = []
        for req in reqs:
            if req.input_ids is not None:
                ids = req.input_ids
                self.check_ids(ids, "input_ids")
            else:
                assert req.text is not None
                ids = ids_of[req.text]
            out.append(self.build_req(req, ids))
        return out

    def build_req(self, req: ReqInput, ids: list[int]) -> TokenizedGenerateReq:
        """The scheduler's message for `req` with prompt `ids`; RequestError if it cannot fit."""
        prompt = "text" if req.text is not None else "input_ids"
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
            input_text=req.text or "",
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
