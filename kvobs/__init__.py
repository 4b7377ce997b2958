"""kvobs: observability for tiered KV caches."""
