"""The OpenAI API and /generate on SmolLM2-135M-Instruct, the session's SmolLM2 server: a chat
answered in its template, and emoji and CJK streamed whole."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from test_http_openai import raw_post
from transformers import AutoTokenizer

from srt.testing.server_process import ServerProcess

pytestmark = pytest.mark.slow


def test_smollm2_answers_a_chat(smollm2_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    messages: Any = [{"role": "user", "content": "What is the capital of France?"}]
    answer = client.chat.completions.create(
        model=model, messages=messages, max_tokens=16, temperature=0
    )
    text = answer.choices[0].message.content
    assert text is not None
    assert "Paris" in text  # an answer, so the chat template framed the question
    assert answer.usage is not None
    # The template's default system prompt and role markers wrap the 7-token question.
    assert answer.usage.prompt_tokens > 20


def test_smollm2_streams_emoji_and_cjk_whole(smollm2_server: ServerProcess, smollm2: Path) -> None:
    """Greedy SmolLM2 repeats a rocket and two Chinese characters (several byte-level tokens
    each): no chunk may carry half a character, through the OpenAI API and /generate."""
    client = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    messages: Any = [{"role": "user", "content": "Echo: \U0001f680 \u706b\u7bad"}]
    greedy: Any = {"max_tokens": 12, "temperature": 0}
    answer = client.chat.completions.create(model=model, messages=messages, **greedy)
    text = answer.choices[0].message.content
    assert text is not None
    assert "\U0001f680" in text
    assert "\u706b\u7bad" in text
    deltas = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model=model, messages=messages, stream=True, **greedy
        )
    ]
    assert "".join(deltas) == text
    assert not any("\ufffd" in delta for delta in deltas)
    # The same prompt through /generate, SGLang's cumulative stream.
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    params = {"max_new_tokens": 12, "temperature": 0}
    body = {"input_ids": ids, "sampling_params": params, "stream": True}
    status, chunks = raw_post(smollm2_server, "/generate", body)
    assert status == 200
    *chunks, done = chunks
    assert done == "[DONE]"
    texts = [chunk["text"] for chunk in chunks]
    assert texts[-1] == text
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
    assert not any("\ufffd" in t for t in texts)


def test_smollm2_answers_in_a_json_schema(smollm2_server: ServerProcess) -> None:
    """The README's example: a real model's answer under `response_format`, valid JSON of the
    schema, and a real answer in it."""
    client = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
    }
    messages: Any = [{"role": "user", "content": "Name the capital of France and its population."}]
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": schema},
    }
    answer = client.chat.completions.create(
        model=model,
        messages=messages,
        response_format=response_format,
        max_tokens=48,
        temperature=0,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content is not None
    reply = json.loads(choice.message.content)
    jsonschema.validate(reply, schema)
    assert "Paris" in reply["city"]


def test_smollm2_calls_a_tool(smollm2_server: ServerProcess) -> None:
    """The README's tools example on a real model: a forced call whose arguments are a real
    answer, then the call and its result sent back for a text answer."""
    client = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    parameters = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }
    tools: Any = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The current weather in a city.",
                "parameters": parameters,
            },
        }
    ]
    messages: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    answer = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=48,
        temperature=0,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls: Any = choice.message.tool_calls
    (call,) = calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, parameters)
    assert "Paris" in arguments["city"]
    result = {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees."}
    history: Any = [*messages, choice.message, result]  # the client's message object, as it came
    final = client.chat.completions.create(
        model=model,
        messages=history,
        tools=tools,
        tool_choice="none",
        max_tokens=24,
        temperature=0,
    )
    assert final.choices[0].message.tool_calls is None
    assert final.choices[0].message.content
