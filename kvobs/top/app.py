"""The refresh loop of ``kvobs top``: scrape every endpoint, draw, wait for a key.

On a terminal the view takes the whole screen (rich's alternate screen, restored on
exit) and redraws every ``interval_s``; ``q`` or Ctrl-C quit cleanly. Keys are read in
cbreak mode (Ctrl-C still interrupts) with ``select``, so a key is seen at once. Off a
terminal each refresh is printed once, one after the other; ``once`` prints a single
frame after two scrapes, so that even it has rates.

Endpoints are scraped concurrently, each with its own timeout, so one that hangs
delays nobody; one that fails is drawn as unreachable and tried again next refresh.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console, RenderableType
from rich.live import Live

from kvobs.top.model import build_view
from kvobs.top.render import render_screen, render_unreachable, render_view
from kvobs.top.scrape import Scrape, fetch


class Watcher:
    """Scrapes a fixed list of endpoints and keeps the previous answer of each."""

    def __init__(self, urls: Sequence[str], timeout_s: float) -> None:
        self.urls = list(urls)
        self.timeout_s = timeout_s
        self.previous: dict[str, Scrape] = {}
        self.failures: dict[str, int] = dict.fromkeys(self.urls, 0)
        self._pool = ThreadPoolExecutor(max_workers=min(8, len(self.urls)),
                                        thread_name_prefix="kvobs-top")

    def poll(self) -> list[Scrape]:
        """One scrape per endpoint, in order."""
        return list(self._pool.map(lambda url: fetch(url, self.timeout_s), self.urls))

    def prime(self) -> None:
        """Scrape once without drawing, so that the next frame has rates."""
        for scrape in self.poll():
            if scrape.ok:
                self.previous[scrape.url] = scrape

    def frame(self, width: int, footer: str, keys: bool = True) -> RenderableType:
        """Scrape everything and draw the screen for ``width`` columns (``keys``: with
        the key help, for the live view that reads keys)."""
        panels: list[RenderableType] = []
        for scrape in self.poll():
            if scrape.ok:
                panels.append(render_view(build_view(scrape, self.previous.get(scrape.url)),
                                          width))
                self.previous[scrape.url] = scrape
                self.failures[scrape.url] = 0
            else:
                self.failures[scrape.url] += 1
                self.previous.pop(scrape.url, None)
                panels.append(render_unreachable(scrape.url, scrape.error or "?",
                                                 self.failures[scrape.url]))
        return render_screen(panels, footer, keys)

    @property
    def any_reachable(self) -> bool:
        """Whether the last poll reached at least one endpoint."""
        return bool(self.previous)

    def close(self) -> None:
        """Stop the scrape threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str]]:
    """A reader ``wait(seconds) -> key or ''``; cbreak mode while stdin is a terminal."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    if fd is None:

        def sleep(seconds: float) -> str:
            time.sleep(max(0.0, seconds))
            return ""

        yield sleep
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def wait(seconds: float) -> str:
        ready, _w, _x = select.select([fd], [], [], max(0.0, seconds))
        return os.read(fd, 32).decode(errors="replace") if ready else ""

    try:
        yield wait
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run_top(urls: Sequence[str], *, interval_s: float = 1.0, timeout_s: float | None = None,
            once: bool = False, should_stop: Callable[[], bool] | None = None,
            footer: str = "", console: Console | None = None) -> int:
    """Watch ``urls`` until ``q``, Ctrl-C or ``should_stop()``; return the exit status.

    Args:
        urls: ``/metrics`` URLs of kvobs endpoints.
        interval_s: seconds between refreshes (rates are over this interval).
        timeout_s: seconds to wait for each endpoint; default ``min(interval_s, 2)``.
        once: print one frame (after two scrapes, for rates) and return.
        should_stop: polled every refresh; true ends the view (the demo's loop ended).
        footer: extra text for the help line (the demo shows where its logs go).
        console: where to draw (tests pass a recording console).

    Returns:
        0, or 1 when ``once`` reached no endpoint.
    """
    console = console or Console()
    watcher = Watcher(urls, timeout_s or min(interval_s, 2.0))
    stop = should_stop or (lambda: False)
    refresh = f"refresh {interval_s:g} s"
    footer = f"{refresh} · {footer}" if footer else refresh
    try:
        if once:
            watcher.prime()
            time.sleep(interval_s)
            console.print(watcher.frame(console.width, footer, keys=False))
            return 0 if watcher.any_reachable else 1
        if not console.is_terminal:
            while not stop():
                console.print(watcher.frame(console.width, footer, keys=False))
                time.sleep(interval_s)
            return 0
        return _live(watcher, console, interval_s, stop, footer)
    except KeyboardInterrupt:
        return 0
    finally:
        watcher.close()


def _live(watcher: Watcher, console: Console, interval_s: float,
          stop: Callable[[], bool], footer: str) -> int:
    with _keys() as wait, Live(console=console, screen=True, auto_refresh=False,
                               transient=True) as live:
        while not stop():
            started = time.monotonic()
            live.update(watcher.frame(console.width, footer), refresh=True)
            while (left := interval_s - (time.monotonic() - started)) > 0:
                key = wait(min(left, 0.25))
                if "q" in key.lower():
                    return 0
                if stop():
                    return 0
    return 0
