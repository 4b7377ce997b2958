"""What ``kvobs demo`` does around its pool: checks before any heavy set-up, the view.

The demo validates everything it can before torch loads or a pool is allocated (a
wrong address after seconds of warm-up is a poor welcome): the port is probed, the
pools are compared with the machine's memory, a missing torch is a one-line error
naming the extra to install. On a terminal the serving loop runs in a thread while
this one draws the ``kvobs top`` view of the demo's own endpoint.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
import tempfile
import threading
import warnings
from typing import Any, TextIO

from kvobs.errors import ConfigError
from kvobs.layout import KVLayout


def check_port_free(metrics_addr: str) -> None:
    """Fail now, not after the warm-up, when the port to serve on is taken."""
    from kvobs.telemetry.prometheus import parse_address

    host, port = parse_address(metrics_addr)
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"--metrics-addr {metrics_addr}: port {port} is already in use: stop "
                    "what serves it or pick another port (port 0: any free one)"
                ) from None
            raise ConfigError(
                f"--metrics-addr {metrics_addr} cannot be bound ({exc.strerror}): use an "
                "address of this machine, e.g. 127.0.0.1:9464"
            ) from None


def check_memory(layout: KVLayout, gpu_blocks: int, host_blocks: int, on_gpu: bool) -> None:
    """Fail before allocating when the pools cannot fit in this machine's memory."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    block = layout.bytes_per_block
    need = (host_blocks + (0 if on_gpu else gpu_blocks)) * block
    if need > 0.9 * ram:
        where = "--host-blocks" if on_gpu else "--gpu-blocks and --host-blocks"
        raise ConfigError(
            f"{where}: the pools need {need / 2**30:,.1f} GiB ({block:,} B per block) but "
            f"this machine has {ram / 2**30:,.1f} GiB of RAM: pass fewer blocks"
        )


def check_gpu_holds_a_request(layout: KVLayout, gpu_blocks: int) -> None:
    """Fail when the GPU tier cannot hold the longest first turn of the chat workload.

    The serving loop rejects a request larger than the whole GPU tier; below this size
    most conversations never start and the demo would serve a tier of rejections. Call
    it once torch is imported: :mod:`kvobs.pool` imports torch.
    """
    from kvobs.pool.workload import WorkloadConfig

    cfg = WorkloadConfig()
    tokens = cfg.system_tokens[1] + cfg.user_tokens[1] + cfg.output_tokens[1]
    need = -(-tokens // layout.block_tokens)
    if gpu_blocks < need:
        raise ConfigError(
            f"--gpu-blocks {gpu_blocks} ({gpu_blocks * layout.block_tokens:,} tokens) cannot "
            f"hold one request of the demo workload (up to {tokens:,} tokens = {need} blocks "
            f"of {layout.block_tokens}): pass --gpu-blocks {need} or more"
        )


def import_torch() -> Any:
    """torch, or a one-line error naming the extra that brings it."""
    try:
        with warnings.catch_warnings():  # the demo never hands torch a NumPy array
            warnings.filterwarnings("ignore", message="Failed to initialize NumPy",
                                    category=UserWarning)
            import torch
    except ImportError:
        raise ConfigError(
            "kvobs demo needs torch (its pool moves real bytes): pip install 'kvobs[demo]'"
        ) from None
    return torch


def want_top(view: str) -> bool:
    """Whether ``--view`` (``auto``: both stdin and stdout are terminals) asks for the view."""
    if view == "auto":
        return sys.stdin is not None and sys.stdin.isatty() and sys.stdout.isatty()
    return view == "top"


def open_log(args: argparse.Namespace, top: bool) -> TextIO | None:
    """The stream the logs go to: ``--log-file``, a temporary file under the view (named
    on screen), or None for stderr. With the view on, say so before the warm-up starts,
    so that the seconds of set-up are not a blank terminal."""
    path = args.log_file
    if path is None and top:
        fd, path = tempfile.mkstemp(prefix="kvobs-demo-", suffix=".log")
        os.close(fd)
    if path is None:
        return None
    args.log_file = path
    try:
        stream = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise ConfigError(f"--log-file {path} cannot be opened ({exc.strerror})") from None
    if top:
        print(f"kvobs demo: allocating the pools and warming up ({args.warmup:g} virtual s), "
              f"then the live view; logs in {path}", file=sys.stderr, flush=True)
    return stream


def run_with_view(loop: Any, duration_s: float | None, stop: threading.Event, url: str,
                   footer: str) -> None:
    """The serving loop in a thread, the ``kvobs top`` view of ``url`` in this one."""
    from kvobs.top import run_top

    runner = threading.Thread(
        target=loop.run, args=(duration_s,), kwargs={"pace": True, "should_stop": stop.is_set},
        name="kvobs-demo-loop", daemon=True,
    )
    runner.start()
    try:
        run_top([url], should_stop=lambda: not runner.is_alive(), footer=footer)
    finally:
        stop.set()
        runner.join(timeout=10)
