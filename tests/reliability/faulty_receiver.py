"""A real OTLP/HTTP receiver that can be told to misbehave, on one fixed loopback port.

Modes (set ``receiver.mode``):

- ``ok``: decode the ExportMetricsServiceRequest and answer 200;
- ``5xx``: read the body, answer 503 (a retryable status);
- ``stall``: read the body, answer 200 only after ``stall_s`` (past the export timeout);
- ``blackhole``: accept and read, never answer (the connection is held until close);
- ``refuse``: nothing listens on the port (connection refused); leaving this mode
  listens again on the same port, so the exporter's endpoint stays valid.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

MODES = ("ok", "5xx", "stall", "blackhole", "refuse")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class FaultyReceiver:
    def __init__(self, stall_s: float = 3.0) -> None:
        self.stall_s = stall_s
        self.requests: list[ExportMetricsServiceRequest] = []
        self.attempts = {mode: 0 for mode in MODES}
        self._mode = "ok"
        self._release = threading.Event()  # set at close: stalled / black-holed handlers end
        self._lock = threading.Lock()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        assert mode in MODES, mode
        with self._lock:
            if mode == "refuse" and self._server is not None:
                self._stop()
            elif mode != "refuse" and self._server is None:
                self._start()
            self._mode = mode

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                mode = receiver._mode
                receiver.attempts[mode] += 1
                if mode == "blackhole":
                    receiver._release.wait()
                    return
                if mode == "stall":
                    receiver._release.wait(receiver.stall_s)
                if mode == "5xx":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                if mode == "ok":
                    receiver.requests.append(request)
                payload = ExportMetricsServiceResponse().SerializeToString()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a stalled answer: the exporter gave up waiting, as it should

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def _start(self) -> None:
        self._server = _Server(("127.0.0.1", self.port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _stop(self) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> FaultyReceiver:
        self.mode = "ok"
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        with self._lock:
            if self._server is not None:
                self._stop()

    def latest_sum(self, name: str, **attrs: str) -> float | None:
        """The value of counter ``name`` (points matching ``attrs``) in the newest request."""
        if not self.requests:
            return None
        total, found = 0.0, False
        for resource_metrics in self.requests[-1].resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name != name:
                        continue
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        labels = {a.key: a.value.string_value for a in point.attributes}
                        if all(labels.get(k) == v for k, v in attrs.items()):
                            total += point.as_int or point.as_double
                            found = True
        return total if found else None
