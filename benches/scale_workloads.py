"""The shared-prefix workload of `bench_scale.py`, in rounds, and what the replicas say about
the requests they served.

SGLang's generated-shared-prefix prompts (`serving_datasets.shared_prefix_requests`: groups of
questions behind one system prompt each) are sent in rounds: round r sends the r-th question of
every group at once, in a shuffled order, and the next round starts when it is done. Requests
in flight together never share a prefix, and a group's later questions always find its prefix
computed by the first one, so the hit rate counts only where each request was routed. Sending
a round at once is also what lets a cache-aware router spread new prefixes: with nothing in
flight it sends every unmatched prompt to the same (least loaded) replica.
"""

from __future__ import annotations

import argparse
import random
import time
import urllib.request
from typing import Any

import bench_serving
from prometheus_client.parser import text_string_to_metric_families
from serving_client import discover_model, discover_tokenizer, flush_cache, new_session
from serving_datasets import BenchTokenizer, shared_prefix_requests
from serving_metrics import RequestResult, summarize


async def shared_prefix_rounds(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """`bench_serving`'s summary of one run of the workload in rounds against `args.base_url`
    (`args` as `bench_serving.parse_args` makes them, `--max-concurrency` the group count)."""
    groups, per_group = args.gsp_num_groups, args.gsp_prompts_per_group
    async with new_session(args.api_key, args.request_timeout) as session:
        model = await discover_model(session, args.base_url)
        tokenizer_path = await discover_tokenizer(session, args.base_url)
        if tokenizer_path is None:
            raise ValueError(f"{args.base_url} does not say its tokenizer")
        rng = random.Random(seed)
        requests = shared_prefix_requests(
            BenchTokenizer(tokenizer_path),
            rng,
            groups,
            per_group,
            args.gsp_system_prompt_len,
            args.gsp_question_len,
            args.gsp_output_len,
        )
        await flush_cache(session, args.base_url)
        results: list[RequestResult] = []
        start = time.perf_counter()
        for question in range(per_group):
            batch = [requests[g * per_group + question] for g in rng.sample(range(groups), groups)]
            done, _ = await bench_serving.run_requests(session, args, model, batch, [0.0] * groups)
            results += done
        duration = time.perf_counter() - start
    summary = summarize(results, duration)
    return {**summary, "is_result": summary["failed"] == 0}


def requests_served(url: str) -> int:
    """The requests the srt server at `url` has finished, from its `/metrics`."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return int(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "srt_requests_total"
        )
    )
