"""Block copies between KV cache tiers (shipped as ``kvobs.kernels``)."""
