"""The dry run's "who runs where" section: the trainer's GPUs, the policy's rollouts and
every collaborator (a stand-in, a server, an in-process engine), with a warning where a
server on this node is likely to share the trainer's GPUs."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from collabrl.engines import is_url
from collabrl.errors import UserError
from collabrl.protocols import registry

if TYPE_CHECKING:
    from collabrl.protocols.config import ProtocolConfig
    from collabrl.train.grpo_config import GRPOTrainConfig
    from collabrl.train.plan_rows import Launch, TrainPlan


def placement_section(
    plan: TrainPlan, config: GRPOTrainConfig, protocol: ProtocolConfig, args: Any, launch: Launch
) -> None:
    section = "who runs where"
    plan.add(section, "trainer GPUs", _trainer_gpus(plan, launch.processes))
    if args.use_vllm and args.vllm_mode == "colocate":
        rollouts = (
            f"TRL's vLLM in every process, {args.vllm_gpu_memory_utilization:.0%} of its GPU, "
            f"tensor parallel {args.vllm_tensor_parallel_size}"
        )
    elif args.use_vllm:
        host = args.vllm_server_base_url or f"{args.vllm_server_host}:{args.vllm_server_port}"
        rollouts = f"trl vllm-serve at {host} (not contacted)"
    else:
        rollouts = "the trained model, in every process (transformers)"
    plan.add(section, "policy (trained)", "accelerate: one copy per process")
    plan.add(section, "policy rollouts", rollouts)
    plan.add(
        section,
        "chat template options",
        protocol.chat_template_kwargs or config.engine.chat_template_kwargs or "none",
    )
    for role, ref in _collaborators(protocol):
        plan.add(section, role, _where(ref, config, plan))
    for collaborator in registry.get(protocol.name).collaborators:
        if collaborator.served and not collaborator.serves(protocol):
            # A model the protocol runs in-process (rSIM's planner): trained beside the policy.
            for ref in registry.collaborator_refs(protocol, collaborator):
                if not on_this_machine(ref):
                    plan.warnings.append(f"model '{ref}' is not on this machine")
                where = "trained beside the policy in every process (float32, DDP)"
                plan.add(section, collaborator.name, f"{ref}: {where}")
    _shared_gpus(plan, _local_servers(protocol, args), launch.processes)


# Host names that put a server on the node the trainer runs on.
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "0.0.0.0", "::1"})


def _visible_gpus() -> list[str] | None:
    """The GPUs CUDA_VISIBLE_DEVICES lists; None when it is unset (every GPU)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if visible is None else [g.strip() for g in visible.split(",") if g.strip()]


def _trainer_gpus(plan: TrainPlan, processes: int) -> str:
    """Where accelerate puts the processes: process i on the i-th visible GPU."""
    visible = _visible_gpus()
    if visible is None:
        return f"CUDA_VISIBLE_DEVICES unset: a node's process k on its GPU k ({_gpus(processes)})"
    if processes > len(visible):
        plan.warnings.append(
            f"{processes} processes but CUDA_VISIBLE_DEVICES lists {len(visible)} GPUs: "
            "processes share GPUs (set --num_processes to the GPUs listed)"
        )
    return f"CUDA_VISIBLE_DEVICES={','.join(visible)}: {processes} processes"


def _gpus(processes: int) -> str:
    return "GPU 0" if processes == 1 else f"GPUs 0–{processes - 1}"


def _local_servers(protocol: ProtocolConfig, args: Any) -> list[tuple[str, str]]:
    """(role, URL) of the servers the run calls on this node: teachers and experts at a
    local address, and TRL's policy server in vllm_mode server."""
    servers = [(role, ref) for role, ref in _collaborators(protocol) if is_url(ref)]
    if args.use_vllm and args.vllm_mode == "server":
        host = f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        servers.append(("trl vllm-serve", args.vllm_server_base_url or host))
    this_node = socket.gethostname()
    return [(r, u) for r, u in servers if urlparse(u).hostname in {*LOCAL_HOSTS, this_node}]


def _shared_gpus(plan: TrainPlan, servers: list[tuple[str, str]], processes: int) -> None:
    """Warn when the trainer and a server on this node are likely on the same GPUs. The
    heuristic: with CUDA_VISIBLE_DEVICES unset, the trainer's processes take GPUs 0 to
    P-1 (all of a P-GPU node), and a server started on this node without it sits on GPU
    0; where it is set, the trainer keeps to the GPUs it lists and the servers are
    trusted to be elsewhere (their own CUDA_VISIBLE_DEVICES is not visible from here)."""
    if _visible_gpus() is not None:
        return
    for role, url in servers:
        plan.warnings.append(
            f"the trainer and the {role} at {url} may share GPUs: CUDA_VISIBLE_DEVICES is "
            f"unset, so the trainer's {processes} processes take {_gpus(processes)} (a "
            f"{processes}-GPU node: all of them), and a server on this node ({url}) is on "
            "GPUs of the same node; launch the trainer with CUDA_VISIBLE_DEVICES listing "
            "only GPUs the server does not use (and run this dry run with it)"
        )


def _collaborators(protocol: ProtocolConfig) -> list[tuple[str, str]]:
    """(role, model reference or URL) of every model the protocol's spec serves beside
    the policy (a teacher, "experts 1–3 of K = 3", a prompted planner)."""
    found: list[tuple[str, str]] = []
    for collaborator in registry.get(protocol.name).collaborators:
        if collaborator.serves(protocol):
            refs = registry.collaborator_refs(protocol, collaborator)
            if collaborator.many:
                found += _panel(collaborator.name, refs, protocol.consult.num_experts)
            else:
                found += [(collaborator.name, ref) for ref in refs]
    return found


def _panel(name: str, refs: list[str], experts: int) -> list[tuple[str, str]]:
    """A panel of K experts over its endpoints, as the expert pool routes them (round
    robin: expert i to endpoint (i − 1) mod n): one row per endpoint, naming its experts."""
    from collabrl.engines.endpoints import endpoint_index

    rows = []
    for index, ref in enumerate(refs):
        ids = [i for i in range(1, experts + 1) if endpoint_index(i, experts, len(refs)) == index]
        served = _id_list(ids) if ids else "none"
        rows.append((f"{name} {served} of K = {experts}", ref))
    return rows


def _id_list(ids: list[int]) -> str:
    """`1–3` for a run of ids, `1, 3` otherwise."""
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}–{ids[-1]}"
    return ", ".join(map(str, ids))


def _where(ref: str, config: GRPOTrainConfig, plan: TrainPlan) -> str:
    from collabrl.devices import resolve_device
    from collabrl.engines import resolve_kind
    from collabrl.engines.reference import stand_in_description

    stand_in = stand_in_description(ref)
    if stand_in is not None:
        return stand_in
    if is_url(ref):
        return f"server at {ref} (not contacted)"
    if not on_this_machine(ref):
        plan.warnings.append(f"model '{ref}' is not on this machine")
    kind = resolve_kind(ref, config.engine)
    return f"{ref}: {kind} engine on {resolve_device(config.engine.device)}, in every process"


def on_this_machine(ref: str) -> bool:
    """Whether `ref` resolves to a model here (a local folder, the embedded model, the
    hub cache)."""
    from collabrl.models import resolve_model

    try:
        resolve_model(ref)
    except UserError:
        return False
    return True
