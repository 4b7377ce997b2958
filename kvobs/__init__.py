"""kvobs: observability for tiered KV caches."""

__version__ = "0.1.0"
