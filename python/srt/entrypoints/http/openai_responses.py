"""The tokenizer manager's SGLang-shaped results out as OpenAI responses and stream chunks.

Choice `i` of a request with `n` samples per prompt is sample `i % n` of prompt `i // n`, which
is the order (and the `index`) the tokenizer manager gives its results. A request the scheduler
refused (an abort with an HTTP status: 400, 429) becomes the request's error: the whole answer,
or (streaming) an error event. A request aborted without one (`/abort_request`, or a shutdown
that outlasted its grace period) is not an error, as in SGLang and vLLM: its choice keeps what it
generated and ends with finish reason "abort". Usage counts each prompt once however many
samples it has, as OpenAI does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from srt.entrypoints.http.context import abort_error
from srt.entrypoints.http.openai_protocol import OpenAIRequest
from srt.entrypoints.http.openai_tool_output import ToolCallStream, chat_message
from srt.managers.hf_tokenizer import Tokenizer

Result = Mapping[str, Any]


def finish_reason(meta: Mapping[str, Any]) -> str | None:
    """The finish reason of a result ("stop", "length", or "abort" for a request aborted by a
    client, an operator or a shutdown), None while it runs; ApiError for a refused request."""
    reason = meta["finish_reason"]
    if reason is None:
        return None
    error = abort_error(reason)
    if error is not None:
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


def echo_texts(req: OpenAIRequest, tokenizer: Tokenizer) -> list[str]:
    """Each prompt's text, which its choices start with under `echo` (its token ids are valid:
    the builder is made once the tokenizer manager accepted the request)."""
    if req.obj.text is not None:
        return list(req.obj.text)
    prompts: Any = req.obj.input_ids or []
    return [tokenizer.decode(ids) for ids in prompts]


class ResponseBuilder:
    """Builds the answer of one OpenAI request: the whole response, or its stream chunk by
    chunk (remembering, per choice, what earlier chunks said). Made once the tokenizer manager
    accepted the request."""

    def __init__(self, req: OpenAIRequest, model: str, tokenizer: Tokenizer) -> None:
        self.req = req
        self.model = model
        self.tokenizer = tokenizer
        self.echo_texts = echo_texts(req, tokenizer) if req.echo else None
        self.created = int(time.time())
        self.started: set[int] = set()  # choices whose first chunk went out
        self.text_offset: dict[int, int] = {}  # completions logprobs: offset of the next token
        self.metas: dict[int, Mapping[str, Any]] = {}  # each choice's latest meta_info
        self.tool_streams: dict[int, ToolCallStream] = {}  # chats with tools: calls per choice

    # ---- whole responses ---------------------------------------------------------------------

    def response(self, results: Sequence[Result]) -> dict[str, Any]:
        """The response to a request that did not stream; ApiError if one was refused."""
        choices = []
        for i, result in enumerate(results):
            meta = result["meta_info"]
            choice: dict[str, Any] = {"index": i}
            text = self.echo(i) + result["text"]
            reason = finish_reason(meta)
            if self.req.chat:
                choice["message"], reason = chat_message(self.req.tools, text, reason)
            else:
                choice["text"] = text
            choice["logprobs"] = self.logprobs(i, result)
            choice["finish_reason"] = reason
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
        request was refused."""
        i = result.get("index", 0)
        meta = result["meta_info"]
        self.metas[i] = meta
        first = i not in self.started
        self.started.add(i)
        text = (self.echo(i) if first else "") + result["text"]
        choice: dict[str, Any] = {"index": i}
        reason = finish_reason(meta)
        if self.req.chat:
            delta: dict[str, Any] = {"content": text}
            if self.req.tools is not None:
                if first:
                    self.tool_streams[i] = ToolCallStream(self.req.tools)
                delta, reason = self.tool_streams[i].delta(text, reason)
            choice["delta"] = {"role": "assistant", **delta} if first else delta
        else:
            choice["text"] = text
        choice["logprobs"] = self.logprobs(i, result)
        choice["finish_reason"] = reason
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
        texts = self.echo_texts
        return texts[i // self.req.n] if texts is not None else ""

    def logprobs(self, i: int, result: Result) -> dict[str, Any] | None:
        """OpenAI's logprobs of the tokens in `result`, None unless asked for. With `echo`,
        the prompt's tokens come first (in a stream's first chunk of the choice), the first
        with a null logprob and null alternatives, as OpenAI gives them.

        `text_offset` counts the token texts from 0 (as vLLM does): it is the offset into
        the choice's text wherever the token texts spell it (a BOS token, or a character split
        across tokens, shifts the offsets after it)."""
        if self.req.top_logprobs is None:
            return None
        meta = result["meta_info"]
        tokens = self.token_logprobs(meta["output_token_logprobs"])
        tops = self.top_logprobs(meta["output_token_logprobs"], meta["output_top_logprobs"])
        if self.req.chat:
            return {"content": chat_logprobs(tokens, tops), "refusal": None}
        if self.echo_texts is not None and "input_token_logprobs" in meta:
            prompt = meta["input_token_logprobs"]
            tokens = self.token_logprobs(prompt) + tokens
            tops = self.top_logprobs(prompt, meta.get("input_top_logprobs")) + tops
        offsets = []
        offset = self.text_offset.get(i, 0)
        for text, _ in tokens:
            offsets.append(offset)
            offset += len(text)
        self.text_offset[i] = offset
        return {
            "tokens": [text for text, _ in tokens],
            "token_logprobs": [logprob for _, logprob in tokens],
            "top_logprobs": [None if top is None else best_first(top) for top in tops],
            "text_offset": offsets,
        }

    def token_logprobs(self, entries: Sequence[Sequence[Any]]) -> list[tuple[str, Any]]:
        """(text, logprob) of SGLang's `(logprob, token id, None)` entries."""
        return [(self.token_text(token), logprob) for logprob, token, _ in entries]

    def top_logprobs(
        self, entries: Sequence[Sequence[Any]], tops: Sequence[Any] | None
    ) -> list[list[tuple[str, float]] | None]:
        """The alternatives of each entry as (text, logprob), None where its logprob is None
        (the first prompt token); no alternatives when none were asked for."""
        if tops is None:  # top_logprobs_num 0: SGLang leaves the prompt's alternatives out
            return [None if entry[0] is None else [] for entry in entries]
        return [None if top is None else self.token_logprobs(top) for top in tops]

    def token_text(self, token: int) -> str:
        return str(self.tokenizer.decode([token]))


def best_first(top: list[tuple[str, float]]) -> dict[str, float]:
    """Alternatives by text, best first; of tokens that read alike, the best stays."""
    out: dict[str, float] = {}
    for text, logprob in top:
        out.setdefault(text, logprob)
    return out


def chat_logprobs(
    tokens: list[tuple[str, Any]], tops: list[list[tuple[str, float]] | None]
) -> list[dict[str, Any]]:
    """Chat's logprobs `content`: each token with its bytes and its top alternatives."""

    def entry(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return [
        {**entry(text, logprob), "top_logprobs": [entry(t, lp) for t, lp in top or ()]}
        for (text, logprob), top in zip(tokens, tops, strict=False)
    ]
