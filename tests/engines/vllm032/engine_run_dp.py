"""Run the real vLLM engine (CPU build) with data parallelism, the host tier and kvobs,
the way ``vllm serve --data-parallel-size 2`` runs it, and write down vLLM's own
registry (``python engine_run_dp.py OUT.json --workdir DIR``).

vLLM 0.32's ``LLM`` class refuses ``data_parallel_size > 1`` and its offline SPMD mode
refuses dense models, so this drives the API server's engine: ``AsyncLLM`` with
``data_parallel_size=DP``, which starts the DP coordinator and one engine-core process
per rank, each with its own worker process (kvobs enabled in all four by vLLM's plugin
loader). For a dense model the ranks are independent engines: vLLM keeps each one's
rank in ``parallel_config.data_parallel_index`` only.

Each rank gets its own share of ``engine_run.py``'s workload, pinned to it (vLLM's
``data_parallel_rank`` request option): the chats ``c`` with ``c % DP == rank``, then a
probe of its own stored to the host tier, pushed out of the GPU pool and asked again
(host hits onloaded; rank r's probe is 4 + r blocks long, so the ranks' figures
differ). The ranks run at the same time. vLLM's front end keeps each
rank's figures apart (its ``engine`` label), which are the truth the test compares.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from engine_run import (  # a sibling module: this file runs as a script
    BLOCK,
    FLUSHES,
    IN_FLIGHT,
    MAX_MODEL_LEN,
    chats,
    engine_options,
    free_port,
    hold,
    make_model,
    still_running,
    vllm_registry,
)

HERE = Path(__file__).resolve().parent
DP = 2
#: Ports kept free for ``DP`` ranks of one worker each: kvobs's endpoint of each engine
#: core, ``base + rank``, and the opt-in worker endpoints, ``base + 100 + rank`` (which
#: must stay unserved: see ``kvobs.adapters.vllm.plugin``).
OFFSETS = tuple(range(DP)) + tuple(100 + rank for rank in range(DP))


class Rank:
    """One data-parallel rank's requests: at most ``IN_FLIGHT`` at a time, all pinned to
    the rank, each request's tokens kept."""

    def __init__(self, llm: Any, rank: int) -> None:
        self.llm, self.rank = llm, rank
        self.gate = asyncio.Semaphore(IN_FLIGHT)
        self.requests: list[dict[str, Any]] = []

    async def request(self, name: str, prompt: list[int], max_tokens: int) -> list[int]:
        """Run one request on this rank; its generated tokens."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        request_id = f"dp{self.rank}-{name}"
        async with self.gate:
            async for output in self.llm.generate({"prompt_token_ids": prompt}, params,
                                                  request_id, data_parallel_rank=self.rank):
                last = output
        tokens = list(last.outputs[0].token_ids)
        self.requests.append({"id": request_id, "rank": self.rank, "prompt": len(prompt),
                              "output": len(tokens), "cached": last.num_cached_tokens})
        return tokens

    async def chat(self, turns: list[tuple[str, list[int], int]]) -> None:
        """One chat: every turn resends the history with new tokens."""
        history: list[int] = []
        for request_id, new_tokens, max_tokens in turns:
            history += new_tokens
            history += await self.request(request_id, list(history), max_tokens)

    async def workload(self) -> None:
        """This rank's chats, then its probe through the host tier (as ``engine_run``)."""
        turns = list(zip(*chats(), strict=True))  # per chat, its turns
        await asyncio.gather(*(self.chat(list(t)) for c, t in enumerate(turns)
                               if c % DP == self.rank))
        # rank r's probe has 4 + r full blocks: the ranks' savings differ
        probe = [random.Random(7 + self.rank).randrange(2, 500)
                 for _ in range((4 + self.rank) * BLOCK + 5)]
        await self.request("probe", probe, 6)
        await asyncio.gather(*(self.request(f"flush{n}", [3 + n], MAX_MODEL_LEN - 8)
                               for n in range(FLUSHES)))
        await self.request("repeat", probe, 6)
        # no full block: nothing to store; steps the scheduler until the worker has
        # reported every store job back
        await self.request("tail", [1, 2, 3], 4)


async def run(out: Path, workdir: Path) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    model = make_model(workdir / "model")
    base = free_port(*OFFSETS)
    os.environ["KVOBS_METRICS_ADDR"] = f"127.0.0.1:{base}"
    started = time.monotonic()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_options(model),
                                                    data_parallel_size=DP))
    account: dict[str, Any] = {"built_s": time.monotonic() - started, "kvobs_port": base,
                               "dp": DP}
    await asyncio.to_thread(hold, "ready", "go", {"kvobs_port": base, "dp": DP})
    ranks = [Rank(llm, rank) for rank in range(DP)]
    started = time.monotonic()
    await asyncio.gather(*(rank.workload() for rank in ranks))
    account["workload_s"] = time.monotonic() - started
    await asyncio.sleep(0.5)  # the last steps' stats reach the front end's registry
    account["vllm"] = vllm_registry()
    account["requests"] = [r for rank in ranks for r in rank.requests]
    await asyncio.to_thread(hold, "done", "release", {})
    account.update(shutdown(llm))
    del ranks, llm  # vLLM's finalizer runs now, not at interpreter exit
    gc.collect()
    out.write_text(json.dumps(account))


def shutdown(llm: Any) -> dict[str, Any]:
    """Stop the engine (coordinator, engine cores, workers); which of them outlived it."""
    import psutil

    children = [p for p in psutil.Process().children(recursive=True)
                if "VLLM" in " ".join(p.cmdline())]  # vLLM titles its processes
    llm.shutdown()
    return {"engine_processes": len(children),
            "left_running": [p.pid for p in children if still_running(p)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    args.workdir.mkdir(parents=True, exist_ok=True)
    asyncio.run(run(args.out, args.workdir))


if __name__ == "__main__":
    main()
