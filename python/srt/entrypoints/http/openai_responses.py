"""The tokenizer manager's SGLang-shaped results out as OpenAI responses and stream chunks.

Choice `i` of a request with `n` samples per prompt is sample `i % n` of prompt `i // n`, which
is the order (and the `index`) the tokenizer manager gives its results. A result whose finish
reason is an abort becomes the request's error: the whole answer, or (streaming) an error event.
Usage counts each prompt once however many samples it has, as OpenAI does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from srt.entrypoints.http.context import abort_error
from srt.entrypoints.http.errors import ApiError
from srt.entrypoints.http.openai_protocol import OpenAIRequest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Result = Mapping[str, Any]


def finish_reason(meta: Mapping[str, Any]) -> str | None:
    """OpenAI's finish reason ("stop", "length") of a result, None while it runs; ApiError for
    an aborted request."""
    reason = meta["finish_reason"]
    if reason is None:
        return None
    if reason["type"] == "abort":
        error = abort_error(reason)
        if error is None:  # aborted by an operator or a shutdown, not refused
            message = reason.get("message") or "no reason given"
            error = ApiError(500, f"the request was aborted: {message}", code="request_aborted")
        raise error
    return str(reason["type"])


def matched_stop(meta: Mapping[str, Any]) -> Any:
    """The stop string or token id that ended a result (SGLang's extra `matched_stop`)."""
    reason = meta["finish_reason"]
    return reason.get("matched") if reason is not None else None


def usage(metas: list[Mapping[str, Any]], n: int) -> dict[str, Any]:
    """OpenAI's usage of the choices whose results had `metas`, in choice order."""
    firsts = metas[::n]  # one sample per prompt
    prompt = sum(m["prompt_tokens"] for m in firsts)
    completion = sum(m["completion_tokens"] for m in metas)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(m["cached_tokens"] for m in firsts)},
    }


class ResponseBuilder:
    """Builds the answer of one OpenAI request: the whole response, or its stream chunk by
    chunk (remembering, per choice, what earlier chunks said)."""

    def __init__(self, req: OpenAIRequest, model: str, tokenizer: PreTrainedTokenizerBase) -> None:
        self.req = req
        self.model = model
        self.tokenizer = tokenizer
        self.created = int(time.time())
        self.started: set[int] = set()  # choices whose first chunk went out
        self.text_offset: dict[int, int] = {}  # completions logprobs: offset of the next token
        self.metas: dict[int, Mapping[str, Any]] = {}  # each choice's latest meta_info

    # ---- whole responses ---------------------------------------------------------------------

    def response(self, results: Sequence[Result]) -> dict[str, Any]:
        """The response to a request that did not stream; ApiError if one was aborted."""
        choices = []
        for i, result in enumerate(results):
            meta = result["meta_info"]
            choice: dict[str, Any] = {"index": i}
            text = self.echo(i) + result["text"]
            if self.req.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice["logprobs"] = self.logprobs(i, result)
            choice["finish_reason"] = finish_reason(meta)
            choice["matched_stop"] = matched_stop(meta)
            choices.append(choice)
        return {
            **self.header("chat.completion" if self.req.chat else "text_completion"),
            "choices": choices,
            "usage": usage([r["meta_info"] for r in results], self.req.n),
        }

    # ---- streams -----------------------------------------------------------------------------

    def chunk(self, result: Result) -> dict[str, Any]:
        """The stream chunk of one streamed result (the news of one choice); ApiError if the
        request was aborted."""
        i = result.get("index", 0)
        meta = result["meta_info"]
        self.metas[i] = meta
        first = i not in self.started
        self.started.add(i)
        text = (self.echo(i) if first else "") + result["text"]
        choice: dict[str, Any] = {"index": i}
        if self.req.chat:
            choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = self.logprobs(i, result)
        choice["finish_reason"] = finish_reason(meta)
        if choice["finish_reason"] is not None:
            choice["matched_stop"] = matched_stop(meta)
        object_ = "chat.completion.chunk" if self.req.chat else "text_completion"
        return {**self.header(object_), "choices": [choice]}

    def usage_chunk(self) -> dict[str, Any] | None:
        """The last chunk of a stream that asked for usage (`stream_options.include_usage`)."""
        if not self.req.include_usage:
            return None
        metas = [self.metas[i] for i in sorted(self.metas)]
        object_ = "chat.completion.chunk" if self.req.chat else "text_completion"
        return {**self.header(object_), "choices": [], "usage": usage(metas, self.req.n)}

    # ---- parts -------------------------------------------------------------------------------

    def header(self, object_: str) -> dict[str, Any]:
        return {
            "id": self.req.response_id,
            "object": object_,
            "created": self.created,
            "model": self.model,
        }

    def echo(self, i: int) -> str:
        texts = self.req.echo_texts
        return texts[i // self.req.n] if texts is not None else ""

    def logprobs(self, i: int, result: Result) -> dict[str, Any] | None:
        """OpenAI's logprobs of the tokens in `result`, None unless asked for."""
        if self.req.top_logprobs is None:
            return None
        meta = result["meta_info"]
        tokens = [
            (self.token_text(token), logprob) for logprob, token, _ in meta["output_token_logprobs"]
        ]
        tops = [
            [(self.token_text(token), logprob) for logprob, token, _ in top]
            for top in meta["output_top_logprobs"]
        ]
        if self.req.chat:
            return {"content": chat_logprobs(tokens, tops), "refusal": None}
        offsets = []
        offset = self.text_offset.get(i, len(self.echo(i)))
        for text, _ in tokens:
            offsets.append(offset)
            offset += len(text)
        self.text_offset[i] = offset
        return {
            "tokens": [text for text, _ in tokens],
            "token_logprobs": [logprob for _, logprob in tokens],
            "top_logprobs": [best_first(top) for top in tops],
            "text_offset": offsets,
        }

    def token_text(self, token: int) -> str:
        return str(self.tokenizer.decode([token]))


def best_first(top: list[tuple[str, float]]) -> dict[str, float]:
    """Alternatives by text, best first; of tokens that read alike, the best stays."""
    out: dict[str, float] = {}
    for text, logprob in top:
        out.setdefault(text, logprob)
    return out


def chat_logprobs(
    tokens: list[tuple[str, float]], tops: list[list[tuple[str, float]]]
) -> list[dict[str, Any]]:
    """Chat's logprobs `content`: each token with its bytes and its top alternatives."""

    def entry(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return [
        {**entry(text, logprob), "top_logprobs": [entry(t, lp) for t, lp in top]}
        for (text, logprob), top in zip(tokens, tops, strict=False)
    ]
