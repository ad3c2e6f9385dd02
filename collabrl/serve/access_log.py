"""Each request counted in the metrics and written as one line of the access log, a
client's text escaped so that it can neither end the line nor forge another."""

from __future__ import annotations

import time
from typing import Any, TextIO

from collabrl.serve.metrics import ServerMetrics
from collabrl.serve.openai_api import printable


class RequestRecord:
    """Each request in the metrics and, when `out` is given, one line in the log, as
    uvicorn's access log and vLLM's server write it, plus the model, the token counts,
    the latency (to the last byte, a stream's included) and an error's reason."""

    def __init__(self, app: Any, metrics: ServerMetrics, out: TextIO | None) -> None:
        self.app, self.metrics, self.out = app, metrics, out

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # unless a response starts
        state = scope.setdefault("state", {})  # `request.state` of the routes

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - start
            self.metrics.observe(scope["method"], scope["path"], status, state, seconds)
            if self.out is not None:
                print(_log_line(scope, status, state, seconds), file=self.out)
                self.out.flush()


def _log_line(scope: dict, status: int, state: dict, seconds: float) -> str:
    host, port = scope.get("client") or ("-", 0)
    query = f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else ""
    request = f"{scope['method']} {scope['path']}{query} HTTP/{scope.get('http_version', '1.1')}"
    fields = [f'INFO:     {host}:{port} - "{_loggable(request)}" {status}']
    if "model" in state:
        fields.append(f"model={_loggable(state['model'])}")
    if "usage" in state:
        usage = state["usage"]
        fields.append(f"prompt_tokens={usage['prompt_tokens']}")
        fields.append(f"completion_tokens={usage['completion_tokens']}")
    if state.get("abandoned"):
        fields.append("client closed the stream")
    fields.append(f"latency={seconds:.3f}s")
    if "error" in state:  # why it was refused, as its client was told
        fields.append(f'error="{_loggable(state["error"])}"')
    return " ".join(fields)


# Characters a client may put in a logged field (a path's %0A arrives decoded) that would
# end the line or fake one, move a terminal's cursor, or blur where the quoted request
# ends: C0 and C1 controls, DEL, Unicode's line and paragraph separators, `"` and `\`.
_LOG_ESCAPES = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    for code in (*range(0x20), 0x22, 0x5C, *range(0x7F, 0xA0), 0x2028, 0x2029)
}


def _loggable(text: str) -> str:
    """`text` with what could forge or break a log line escaped (`\\xNN`): each request
    is one line, whatever its path."""
    return printable(text.translate(_LOG_ESCAPES))
