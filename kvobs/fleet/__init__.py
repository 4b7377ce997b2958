"""The fleet view: what the replicas of a model hold, twice or once, and what routing by
prefix would win, read from the engines' own KV cache events (``kvobs fleet``)."""
