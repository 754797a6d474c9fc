"""The one line the main process logs for each finished request (issue item 9).

    Finish: rid=r1 finish_reason=length prompt_tokens=12 completion_tokens=8 cached_tokens=0 ...
        e2e_latency=0.081s tokenize=0.21ms send=0.02ms transfer=0.09ms queue=0.01ms ...

The stages (`request_times.RequestTimes.log_fields`) say where the request spent its time.
Prompt and output text appear only with `--log-requests`. Everything a client chose (request
id, texts, an abort's message that may quote them) is escaped with `srt.logs.escape`.
"""

from __future__ import annotations

import logging

from srt.io_struct import FinishReason
from srt.logs import escape

logger = logging.getLogger(__name__)


def log_finished(
    rid: str,
    reason: FinishReason,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    e2e_latency: float,
    stages: str = "",
    texts: tuple[str, str] | None = None,
) -> None:
    """Logs a finished request at INFO, with its `stages`; `texts`, (prompt, output), only
    with `--log-requests`."""
    if not logger.isEnabledFor(logging.INFO):
        return
    line = (
        f"Finish: rid={escape(rid)} finish_reason={reason.type} prompt_tokens={prompt_tokens} "
        f"completion_tokens={completion_tokens} cached_tokens={cached_tokens} "
        f"e2e_latency={e2e_latency:.3f}s"
    )
    if stages:
        line += f" {stages}"
    if reason.message:
        line += f' message="{escape(reason.message)}"'
    if texts is not None:
        line += f' prompt="{escape(texts[0])}" output="{escape(texts[1])}"'
    logger.info("%s", line)
