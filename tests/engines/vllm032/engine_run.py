"""Run a real vLLM engine (the CPU build) with a host tier and kvobs, and write down
every account of what happened: vLLM's own Prometheus registry, its KV cache events (from
its ZMQ publisher, as an external consumer reads them), the tokens it generated, its log
lines, and kvobs's ``/metrics`` as a scrape reads it. The tests compare these accounts;
this script computes nothing of kvobs's.

Run as a separate process per engine (``python engine_run.py OUT.json --mode single``):
vLLM's metrics live in the process-wide Prometheus registry, and the plugin's state is
process-wide too. ``--mode multi`` runs vLLM's default multi-process engine (an
engine-core process and a worker process, kvobs enabled in each by vLLM's plugin loader);
``single`` sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and, because the scheduler then runs in
this process, also records kvobs against vLLM after every step. In both modes the run
notes, per step, vLLM's external prefix-cache hits so far and which requests had no output
before it and their first in it (``schedule``), when each request was submitted, and every
KV event's details in arrival order (``kv_events``): enough to tell which host blocks vLLM
loaded back and when (``test_vllm_thrash.py``).

The workload is a multi-turn chat: ``CHATS`` chats, each with its own history, resent with
new tokens every turn, two requests in flight. No two requests in flight share a block
(every chat has its own prefix), and no request is preempted (two of the longest fit the
GPU pool), so every GPU prefix hit reuses a cached block and vLLM's per-request token
counts give the blocks each request held. A chat's earlier turns are pushed out of the
GPU pool by the other chats before it returns, and come back from the host tier.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import threading
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BLOCK = 32               # CPU attention needs a multiple of 32
GPU_BLOCKS = 24          # one of them is vLLM's null block
MAX_MODEL_LEN = 224      # 7 blocks: two requests in flight always fit
HOST_CHUNKS = 24
CHATS, TURNS, IN_FLIGHT = 8, 3, 2
FLUSHES = 4              # x 7 decode blocks > the GPU pool
MODEL = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
         "max_position_embeddings": 1024}
DTYPE = "float32"


def make_model(path: Path) -> Path:
    """A tiny Llama with random weights (seeded), saved as a Hugging Face checkpoint."""
    if (path / "config.json").exists():
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**MODEL)).save_pretrained(path)
    return path


def free_port(*offsets: int) -> int:
    """A port free on 127.0.0.1 together with ``port + offset`` for every offset (kvobs's
    worker ports: ``free_port(100)``; a data-parallel engine's: every rank's)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + max(offsets, default=0) > 65535:
            continue
        try:
            for offset in offsets:
                if offset:
                    with socket.socket() as sock:
                        sock.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port range")


class EventLog:
    """Subscribes to vLLM's KV event publisher: tallies blocks by (event, medium), and keeps
    every event's details in arrival order (at most ``MAX_EVENTS``: this workload's events
    number a few hundred; any beyond are counted in ``overflow``, never silently lost)."""

    MAX_EVENTS = 20_000

    def __init__(self, endpoint: str) -> None:
        # Imported here, in the main thread: the same imports in the thread, while the
        # main thread imports vLLM, can raise importlib's _DeadlockError there, and a
        # thread that dies is silent (the run would then report no events at all).
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        self.counts: dict[str, int] = {}
        self.details: list[dict[str, Any]] = []
        self.overflow = 0
        self.batches = 0
        self.failure: BaseException | None = None
        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._sock = zmq.Context.instance().socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(endpoint)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._poller.poll(50):
                    self._tally(self._sock.recv_multipart())
        except BaseException as exc:  # reported by settle()
            self.failure = exc

    def _tally(self, frames: list[bytes]) -> None:
        _topic, seq, payload = frames
        batch = self._decoder.decode(payload)
        self.batches += 1
        self._last = time.monotonic()
        for event in batch.events:
            kind = type(event).__name__
            medium = getattr(event, "medium", None) or "GPU"
            hashes = list(getattr(event, "block_hashes", ()) or ())
            key = f"{kind}/{medium}"
            self.counts[key] = self.counts.get(key, 0) + (len(hashes) or 1)
            if len(self.details) >= self.MAX_EVENTS:
                self.overflow += 1
                continue
            self.details.append({
                "kind": kind, "medium": medium, "ts": batch.ts,
                "seq": int.from_bytes(seq, "big"),
                "block_hashes": [plain_hash(h) for h in hashes],
                "parent_block_hash": plain_hash(getattr(event, "parent_block_hash", None)),
                "token_ids": list(getattr(event, "token_ids", ()) or ())})

    def settle(self, quiet_s: float = 1.0, limit_s: float = 15.0) -> dict[str, int]:
        """The tallies once no batch arrived for ``quiet_s`` seconds."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() - self._last < quiet_s and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.failure is not None:
            raise RuntimeError("the KV event subscriber failed") from self.failure
        return dict(self.counts)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close(linger=0)


def plain_hash(block_hash: Any) -> Any:
    """A block hash as JSON holds it: vLLM publishes 64-bit ints by default
    (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``), raw bytes otherwise (kept as hex)."""
    return block_hash.hex() if isinstance(block_hash, bytes) else block_hash


def vllm_registry() -> list[list[Any]]:
    """Every sample of vLLM's metrics in this process's Prometheus registry (unrounded)."""
    from prometheus_client import REGISTRY

    return [[s.name, dict(s.labels), s.value]
            for family in REGISTRY.collect() if family.name.startswith("vllm:")
            for s in family.samples]


def vllm_total(name: str) -> float:
    """One of vLLM's counters in this process, summed over its labels."""
    name = name.removesuffix("_total")
    return sum(value for sample, _labels, value in vllm_registry()
               if sample == f"{name}_total")


#: Scrapes that did not answer within a Prometheus scrape's default timeout (10 s): when,
#: and every thread's stack at that moment (the run goes on with a second, longer try).
SCRAPE_STALLS: list[dict[str, Any]] = []


def scrape(url: str) -> list[list[Any]]:
    """kvobs's ``/metrics`` as a Prometheus scrape reads it.

    A scrape still unanswered after 10 s is noted in :data:`SCRAPE_STALLS` with every
    thread's stack (what kept the server from answering) and tried once more with 60 s;
    the conftest reports the stalls as warnings."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    except TimeoutError:
        stacks = {f"{thread.name} ({thread.ident})": "".join(traceback.format_stack(frame))
                  for thread in threading.enumerate()
                  if (frame := sys._current_frames().get(thread.ident or -1)) is not None}
        SCRAPE_STALLS.append({"url": url, "at": time.time(), "stacks": stacks})
        print(f"kvobs scrape of {url} unanswered after 10 s; threads:", file=sys.stderr)
        for name, stack in stacks.items():
            print(f"--- {name}\n{stack}", file=sys.stderr)
        with urllib.request.urlopen(url, timeout=60) as response:
            text = response.read().decode()
    return [[s.name, dict(s.labels), s.value]
            for family in text_string_to_metric_families(text) for s in family.samples]


def chats(seed: int = 0) -> list[list[tuple[str, list[int], int]]]:
    """Per turn, the requests ``(id, prompt, max_tokens)``; a turn's prompt is the chat's
    history (earlier prompts and outputs are appended by the run as they come back)."""
    rnd = random.Random(seed)
    return [[(f"chat{c}-turn{t}", [rnd.randrange(2, 500) for _ in range(rnd.randrange(64, 100)
                                                                         if t == 0 else
                                                                         rnd.randrange(16, 30))],
              rnd.randrange(3, 8)) for c in range(CHATS)] for t in range(TURNS)]


def build(model: Path, events: str, kvobs_port: int) -> Any:
    from vllm import LLM
    from vllm.config import KVEventsConfig

    os.environ["KVOBS_METRICS_ADDR"] = f"127.0.0.1:{kvobs_port}"
    return LLM(
        **engine_options(model),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                        endpoint=events, topic="kv"))


def engine_options(model: Path) -> dict[str, Any]:
    """The engine's settings (shared with ``engine_run_dp.py``): the tiny model, the GPU
    pool of ``GPU_BLOCKS``, and the host tier of ``HOST_CHUNKS`` through vLLM's
    ``OffloadingConnector`` with the test's host-copy spec."""
    from vllm.config import KVTransferConfig

    return dict(
        model=str(model), skip_tokenizer_init=True, enforce_eager=True, dtype=DTYPE,
        block_size=BLOCK, enable_prefix_caching=True, num_gpu_blocks_override=GPU_BLOCKS,
        kv_cache_memory_bytes=1 << 23, max_model_len=MAX_MODEL_LEN, max_num_seqs=IN_FLIGHT,
        disable_log_stats=False, seed=0,
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": HOST_CHUNKS * host_chunk_bytes(),
                                       "spec_name": "HostCopyOffloadingSpec",
                                       "spec_module_path": "cpu_offloading"}))


def host_chunk_bytes() -> int:
    """Bytes of one GPU block of the test model (= one host chunk), from its config:
    K and V x layers x KV heads x head size x 4 bytes (float32) x tokens per block."""
    head = MODEL["hidden_size"] // MODEL["num_attention_heads"]
    return 2 * MODEL["num_hidden_layers"] * MODEL["num_key_value_heads"] * head * 4 * BLOCK


def break_every_reader() -> None:
    """``KVOBS_TEST_BROKEN=1``: every hook kvobs installs gets readers that raise (the
    counting fast path included), so every wrapped vLLM call runs a failing reader
    (single-process engine: the adapters are installed in this process)."""
    import dataclasses
    import importlib
    import pkgutil

    import kvobs.adapters.vllm as package
    from kvobs.adapters import _hooks

    def broken(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("kvobs reader broken on purpose")

    def break_hook(hook: Any) -> Any:
        return dataclasses.replace(hook, means="track", count=None, before=broken,
                                   after=broken)

    original = _hooks.instrument

    def instrument(target: Any, spec: Any, make: Any) -> Any:
        spec = dataclasses.replace(spec, hooks=tuple(map(break_hook, spec.hooks)))
        return original(target, spec, make)

    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if getattr(module, "instrument", None) is original:
            module.instrument = instrument  # type: ignore[attr-defined]


def run(mode: str, out: Path, workdir: Path) -> None:
    if os.environ.get("KVOBS_TEST_BROKEN") == "1":
        break_every_reader()
    model = make_model(workdir / "model")
    events_endpoint = f"ipc://{workdir}/kv-events"
    event_log = EventLog(events_endpoint)
    kvobs_port = free_port(100)
    started = time.monotonic()
    llm = build(model, events_endpoint, kvobs_port)
    built_s = time.monotonic() - started
    engine = llm.llm_engine
    account: dict[str, Any] = {"mode": mode, "built_s": built_s, "kvobs_port": kvobs_port,
                               "requests": [], "steps": [], "schedule": [], "submitted": {}}
    metrics_url = f"http://127.0.0.1:{kvobs_port}/metrics"
    hold("ready", "go", {"kvobs_port": kvobs_port})  # a scraper sees the counters at 0
    from vllm import SamplingParams

    step_checks = mode == "single"
    enabled = os.environ.get("KVOBS_ENABLE") == "1"
    histories: dict[int, list[int]] = {}
    outputs: dict[str, list[int]] = {}

    answered: set[str] = set()  # requests with an output (their prefill ran)

    def drain(limit: int, unanswered: bool = False) -> None:
        """Step until fewer than ``limit`` requests are in flight (``unanswered``: and
        every one has its first output, so that vLLM admits one new request at a time and
        each step's external hits belong to one request: see test_vllm_thrash.py)."""
        while engine.has_unfinished_requests() and (
                in_flight() >= limit or (unanswered and pending - answered)):
            waiting = sorted(pending - answered)
            began = time.time()
            first = []
            for output in engine.step():
                if output.request_id not in answered:
                    answered.add(output.request_id)
                    first.append(output.request_id)
                if output.finished:
                    finish(output)
            # Which requests vLLM may have admitted in this step, as its outputs tell: the
            # external prefix-cache hits it counted in it belong to requests that had no
            # output before the step, and none in it (see test_vllm_thrash.py).
            account["schedule"].append({
                "began": began, "ended": time.time(), "waiting": waiting, "first": first,
                "external_hits": vllm_total("vllm:external_prefix_cache_hits")})
            if step_checks:
                account["steps"].append({"vllm": vllm_registry(),
                                         "kvobs": scrape(metrics_url) if enabled else []})

    pending: set[str] = set()

    def in_flight() -> int:
        return len(pending)

    def finish(output: Any) -> None:
        pending.discard(output.request_id)
        tokens = list(output.outputs[0].token_ids)
        outputs[output.request_id] = tokens
        account["requests"].append({
            "id": output.request_id, "prompt": len(output.prompt_token_ids),
            "prompt_tokens": list(output.prompt_token_ids),
            "output": len(tokens), "cached": output.num_cached_tokens,
            "tokens": tokens,
            "logprobs": [next(iter(step.values())).logprob
                         for step in output.outputs[0].logprobs or ()]})

    def submit(request_id: str, prompt: list[int], max_tokens: int) -> None:
        drain(IN_FLIGHT, unanswered=True)
        account["submitted"][request_id] = time.time()  # vLLM admits it after this
        engine.add_request(request_id, {"prompt_token_ids": prompt},
                           SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0,
                                          ignore_eos=True))
        pending.add(request_id)

    for turn, requests in enumerate(chats()):
        for chat, (request_id, new_tokens, max_tokens) in enumerate(requests):
            if turn:
                prev = f"chat{chat}-turn{turn - 1}"
                while prev not in outputs:
                    drain(1)
                histories[chat] += outputs[prev]
            histories[chat] = histories.get(chat, []) + new_tokens
            submit(request_id, list(histories[chat]), max_tokens)
    drain(1)
    # The data itself: a fresh prompt (nothing cached), stored to the host tier; then
    # requests that fill the GPU pool with decode blocks alone (vLLM offloads prompts
    # only, so the host tier keeps the probe); then the probe again, from the host.
    probe = [random.Random(7).randrange(2, 500) for _ in range(4 * BLOCK + 5)]
    submit("probe", probe, 6)
    drain(1)
    for n in range(FLUSHES):
        submit(f"flush{n}", [3 + n], MAX_MODEL_LEN - 8)
    drain(1)
    account["repeat_of"] = "probe"
    before = vllm_total("vllm:external_prefix_cache_hits")
    submit("repeat", probe, 6)
    drain(1)
    account["repeat_external_hits"] = vllm_total("vllm:external_prefix_cache_hits") - before
    # A short last request (no full block: nothing to store) steps the scheduler until
    # the worker has reported every store job back; an idle engine takes no steps.
    submit("tail", [1, 2, 3], 4)
    drain(1)
    time.sleep(0.5)
    account["events"] = event_log.settle()
    account["kv_events"] = event_log.details  # every event, in arrival order
    account["kv_events_overflow"] = event_log.overflow
    account["vllm"] = vllm_registry()
    account["kvobs"] = scrape(metrics_url) if enabled else []
    account["scrape_stalls"] = SCRAPE_STALLS
    if mode == "multi" and enabled:
        account["kvobs_worker"] = scrape(f"http://127.0.0.1:{kvobs_port + 100}/metrics")
    else:
        from vllm.v1.engine.core_client import InprocClient

        assert isinstance(engine.engine_core, InprocClient)
        core = engine.engine_core.engine_core
        worker = core.model_executor.driver_worker.worker.model_runner
        account["host_buffer_bytes"] = host_buffer_bytes(worker)
    hold("done", "release", {})  # a scraper reads the final counters
    account["outputs"] = outputs
    import psutil

    children = [p for p in psutil.Process().children(recursive=True)  # vLLM titles them
                if "VLLM" in " ".join(p.cmdline())]  # the engine core and its worker
    shutdown(llm)
    account["engine_processes"] = len(children)
    account["left_running"] = [p.pid for p in children if still_running(p)]
    event_log.close()
    out.write_text(json.dumps(account))


def hold(mark: str, wait_for: str, note: dict[str, Any], limit_s: float = 180.0) -> None:
    """With ``KVOBS_TEST_HOLD_DIR`` set: write ``mark`` (JSON ``note``) there and wait
    until the test writes ``wait_for`` (a Prometheus scraping the engine meanwhile)."""
    folder = os.environ.get("KVOBS_TEST_HOLD_DIR")
    if not folder:
        return
    (Path(folder) / mark).write_text(json.dumps(note))
    deadline = time.monotonic() + limit_s
    while not (Path(folder) / wait_for).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"engine_run: nobody wrote {wait_for} in {limit_s:g} s")
        time.sleep(0.1)


def host_buffer_bytes(model_runner: Any) -> int:
    """Bytes of the host buffers the test worker allocated (the host tier's real size)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    worker = get_kv_transfer_group().connector_worker.worker
    return sum(t.numel() * t.element_size() for t in worker.host)


def still_running(process: Any, wait_s: float = 10.0) -> bool:
    """Whether ``process`` is still alive ``wait_s`` seconds from now (zombies are not)."""
    import psutil

    try:
        process.wait(timeout=wait_s)
    except psutil.TimeoutExpired:
        return True
    except psutil.NoSuchProcess:
        pass
    return False


def shutdown(llm: Any) -> None:
    """Stop the engine core (multi-process: its process and the worker's)."""
    core = llm.llm_engine.engine_core
    core.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--mode", choices=("single", "multi"), required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # vLLM imports the offloading spec by module name (``cpu_offloading``): this script's
    # folder is already first on this process's path, and the workers' through PYTHONPATH
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    if args.mode == "single":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    else:  # the worker's opt-in endpoint too (its shards' device times)
        os.environ["KVOBS_WORKER_METRICS"] = "1"
    args.workdir.mkdir(parents=True, exist_ok=True)
    run(args.mode, args.out, args.workdir)


if __name__ == "__main__":
    main()
