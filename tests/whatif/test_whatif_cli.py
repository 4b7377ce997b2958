"""`kvobs whatif`: traces from the reference pool, answered and checked against exact LRU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvobs.pool import ServingLoop, TieredKVPool
from kvobs.pool.workload import ChatWorkload, WorkloadConfig
from kvobs.presets import preset_layout
from kvobs.recorder import Recorder
from kvobs.trace import TraceWriter, read_trace
from tests.lru_oracle import Event, exact_lru_event_hit_ratio


def kvobs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvobs", *args], capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def chat_trace(tmp_path_factory) -> Path:
    """Two virtual minutes of the demo's chat workload, traced at the pool's lookups."""
    path = tmp_path_factory.mktemp("trace") / "chat.jsonl"
    rec = Recorder(engine="test")
    pool = TieredKVPool(preset_layout("qwen2.5-0.5b"), 256, 1024, rec, device="cpu")
    loop = ServingLoop(pool, ChatWorkload(WorkloadConfig(rate=2.0), seed=7))
    with path.open("w") as out:
        rec.trace = TraceWriter(out, clock=lambda: loop.now_s)
        loop.run(120.0, pace=False)
    return path


def references(path: Path) -> list[Event]:
    """The trace's events: lookups' blocks (counted) and answers' written blocks."""
    with path.open() as lines:
        return [(block, not record.written) for record in read_trace(lines)
                for block in record.blocks]


def exact_lru_hit_ratio(events: list[Event], size: int) -> float:
    return exact_lru_event_hit_ratio(events, size)


def test_json_answer_equals_an_exact_lru_simulation(chat_trace):
    sizes = [100, 300, 1000, 1280, 3000]
    result = kvobs("whatif", "--trace", str(chat_trace), "--sizes", ",".join(map(str, sizes)),
                   "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    refs = references(chat_trace)
    looked_up = sum(1 for _, counted in refs if counted)
    assert answer["exact"] and answer["references"] == looked_up > 10_000
    assert len(refs) > looked_up  # answers written during decode are in the trace too
    assert [row["blocks"] for row in answer["sizes"]] == sizes
    for row in answer["sizes"]:
        assert row["hit_ratio"] == pytest.approx(exact_lru_hit_ratio(refs, row["blocks"]),
                                                 abs=1e-9)


def test_gib_sizes_read_as_host_hits_for_a_model(chat_trace):
    block = preset_layout("qwen2.5-0.5b").bytes_per_block
    gpu_gib, host_gib = 256 * block / 2**30, [512 * block / 2**30, 1024 * block / 2**30]
    result = kvobs("whatif", "--trace", str(chat_trace), "--model", "qwen2.5-0.5b",
                   "--gpu-gib", f"{gpu_gib}", "--host-gib", ",".join(map(str, host_gib)))
    assert result.returncode == 0, result.stderr
    refs = references(chat_trace)
    gpu = exact_lru_hit_ratio(refs, 256)
    hosts = [exact_lru_hit_ratio(refs, n) - gpu for n in (512, 1024)]
    assert f"GPU hits {gpu:.0%}" in result.stdout
    assert f"host hits {hosts[0]:.0%} -> {hosts[1]:.0%} (inclusive tiers)" in result.stdout
    exclusive = kvobs("whatif", "--trace", str(chat_trace), "--model", "qwen2.5-0.5b",
                      "--gpu-gib", f"{gpu_gib}", "--host-gib", f"{host_gib[0]}", "--exclusive",
                      "--json")
    host = json.loads(exclusive.stdout)["host"][0]
    assert host["host_hit_ratio"] == pytest.approx(exact_lru_hit_ratio(refs, 768) - gpu)


@pytest.mark.parametrize(("args", "message"), [
    (["--sizes", "10,abc"], "'abc' is not a number"),
    (["--sizes", "0"], "--sizes takes positive whole numbers"),
    (["--sizes", "inf"], "--sizes takes positive whole numbers"),
    (["--gpu-gib", "16"], "--gpu-gib GIB and --host-gib GIB,GIB,... go together"),
])
def test_bad_flags_are_one_line_errors(chat_trace, args, message):
    result = kvobs("whatif", "--trace", str(chat_trace), *args)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_malformed_trace_names_its_line(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"blocks": ["a"]}\n{"blocks": "a"}\n')
    result = kvobs("whatif", "--trace", str(trace))
    assert result.returncode == 2
    assert f"{trace}:2: \"blocks\" must be a list of block hashes" in result.stderr
    trace.write_text("")
    assert "holds no block references" in kvobs("whatif", "--trace", str(trace)).stderr


def test_demo_trace_out_feeds_whatif(tmp_path):
    trace = tmp_path / "demo.jsonl"
    demo = kvobs("demo", "--duration", "1", "--warmup", "30", "--metrics-addr", "127.0.0.1:0",
                 "--view", "logs", "--gpu-blocks", "256", "--host-blocks", "1024",
                 "--trace-out", str(trace), "--trace-max-bytes", "4000000")
    assert demo.returncode == 0, demo.stderr[-2000:]
    lines = trace.read_text().splitlines()
    kinds = {frozenset(json.loads(line)) for line in lines}
    assert kinds == {frozenset({"blocks", "ts"}), frozenset({"written", "ts"})}
    assert len(trace.read_bytes()) <= 4_000_000
    answer = json.loads(kvobs("whatif", "--trace", str(trace), "--sizes", "256,1280",
                              "--json").stdout)
    refs = references(trace)
    assert [round(row["hit_ratio"], 9) for row in answer["sizes"]] == \
        [round(exact_lru_hit_ratio(refs, size), 9) for size in (256, 1280)]


def test_a_trace_past_the_exact_limit_is_exact_while_every_block_fits(chat_trace):
    """Past the exact replay's limit the profile samples only once the blocks in use
    outgrow its bound; a trace whose blocks all fit is still answered exactly."""
    from kvobs.whatif import curve_from_trace

    events = references(chat_trace)
    with chat_trace.open() as lines:
        curve = curve_from_trace(lines, exact_limit=10)   # far below the trace's references
    assert curve.exact
    for size in (64, 300, 1000):
        assert curve.hit_ratio(size) == pytest.approx(exact_lru_hit_ratio(events, size),
                                                      abs=1e-12)


@pytest.mark.parametrize(("share", "words"), [
    (None, "sampled profile"), (1.0, "every block tracked: exact at the bucket bounds"),
    (0.25, "sampled profile, 0.25 of blocks tracked")])
def test_a_fleet_curve_says_how_it_was_measured(share, words):
    from kvobs.cli.whatif_cmd import _profile_kind

    assert _profile_kind(share) == words


@pytest.mark.parametrize(("share", "exact", "words"), [
    (0.5, 131072.0, "exact at the bucket bounds up to 131,072 blocks"),
    (0.0625, 131072.0, "exact at the bucket bounds up to 131,072 blocks, sampled profile, "
                       "0.0625 of blocks tracked beyond"),
    (0.25, 0.0, "sampled profile, 0.25 of blocks tracked"),
    (None, 4096.0, "exact at the bucket bounds up to 4,096 blocks, sampled profile beyond")])
def test_a_fleet_curve_says_up_to_where_its_exact_stack_answers(share, exact, words):
    """Engines with the exact LRU stack: exact up to its blocks whatever the sampled share;
    the table's largest size (here 200,000 blocks, or 100,000) says whether it all is."""
    from kvobs.cli.whatif_cmd import _profile_kind

    largest = 100_000.0 if share == 0.5 else 200_000.0
    assert _profile_kind(share, exact, largest) == words
