"""Sinks that read recorder snapshots: OpenTelemetry metrics, Prometheus, structlog."""
