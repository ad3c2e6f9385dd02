"""Configuration of `collab serve`."""

from __future__ import annotations

from dataclasses import dataclass

from collabrl.config import option
from collabrl.tools.python import PythonToolConfig
from collabrl.tools.retrieval import RetrievalConfig
from collabrl.tools.toolset import LOCAL_TOOLS

# `tools` serves no model: the Python and retrieval tools over MCP (docs/mcp.md).
ROLES = ("expert", "teacher", "policy", "judge", "planner", "tools")
TRANSPORTS = ("http", "stdio")


@dataclass
class ServeConfig:
    """One model served over the OpenAI-compatible HTTP API."""

    role: str = option("expert", f"What the model is for: {', '.join(ROLES)}.")
    model: str = option("smollm2-135m", "Model reference: embedded name, folder, .gguf, LoRA.")
    engine: str = option(
        "auto", "vllm | transformers | auto (vllm when installed and a GPU is visible)."
    )
    served_model_name: str | None = option(
        None, "Name clients pass as `model` (default: the role, as in EAPO's appendix E)."
    )
    host: str = option("127.0.0.1", "Address to bind; 0.0.0.0 or :: exposes the server.")
    port: int = option(8000, "TCP port.")
    api_key: str | None = option(
        None, "Require this key on every endpoint but /health (default: $COLLABRL_API_KEY)."
    )
    # embedded (transformers) server
    max_batch_size: int = option(16, "Most requests generated together (embedded server).")
    batch_wait_ms: float = option(
        10.0,
        "A batch closes once no request has come for this long, or when it is full "
        "(embedded server).",
    )
    dtype: str = option(
        "auto",
        "Weights dtype of the embedded server and of vLLM's CPU build: auto (bfloat16 on a "
        "GPU that has it, else float16; float32, the fastest, on a CPU), float32, bfloat16, "
        "float16. vLLM on a GPU uses the model's.",
    )
    device: str = option(
        "auto",
        "Torch device of the embedded server: auto (cuda when torch sees a GPU, else cpu), "
        "cpu, cuda, cuda:1, mps.",
    )
    # vLLM (flags of EAPO's appendix E, host and request logging aside)
    gpu_memory_utilization: float = option(0.8, "vllm serve --gpu-memory-utilization.")
    kv_cache_mb: int = option(
        4096,
        "vLLM's CPU build: --kv-cache-memory-bytes, in MiB (there --gpu-memory-utilization "
        "would reserve that share of the machine's RAM).",
    )
    max_model_len: int = option(32768, "vllm serve --max-model-len.")
    tensor_parallel_size: int = option(1, "vllm serve --tensor-parallel-size.")
    trust_remote_code: bool = option(True, "vllm serve --trust-remote-code.")
    log_requests: bool = option(False, "Log every request (vLLM's request log).")
    vllm_args: list[str] = option([], "Extra arguments appended to `vllm serve` verbatim.")
    # the tools role: an MCP server
    transport: str = option(
        "http", "tools role: MCP transport, http (streamable HTTP at /mcp) or stdio."
    )
    tools: list[str] = option(list(LOCAL_TOOLS), "tools role: the tools served.")
    python: PythonToolConfig = option(PythonToolConfig(), "tools role: the python tool.")
    retrieval: RetrievalConfig = option(RetrievalConfig(), "tools role: the retrieve tool.")

    def check(self) -> None:
        """Refuse a device or dtype name no engine loads, before the model is loaded."""
        from collabrl.devices import check_device, check_dtype

        check_device(self.device, "device")
        check_dtype(self.dtype, "dtype")

    @property
    def name(self) -> str:
        return self.served_model_name or self.role
