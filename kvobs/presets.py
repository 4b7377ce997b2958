"""Model configs embedded for ``--model PRESET``, so the demo runs with no download.

Each entry keeps only the fields of the model's published Hugging Face ``config.json``
that decide the KV layout.

Example:
    >>> from kvobs.presets import preset_layout
    >>> preset_layout("deepseek-v2-lite").bytes_per_token
    31104
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvobs.errors import ConfigError
from kvobs.layout import KVLayout

PRESETS: Mapping[str, Mapping[str, Any]] = {
    "llama-3-8b": {
        "_name_or_path": "meta-llama/Meta-Llama-3-8B",
        "model_type": "llama",
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "torch_dtype": "bfloat16",
    },
    "llama-3-70b": {
        "_name_or_path": "meta-llama/Meta-Llama-3-70B",
        "model_type": "llama",
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "hidden_size": 8192,
        "torch_dtype": "bfloat16",
    },
    "qwen2.5-0.5b": {
        "_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct",
        "model_type": "qwen2",
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "hidden_size": 896,
        "torch_dtype": "bfloat16",
    },
    "qwen2.5-7b": {
        "_name_or_path": "Qwen/Qwen2.5-7B",
        "model_type": "qwen2",
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "hidden_size": 3584,
        "torch_dtype": "bfloat16",
    },
    "deepseek-v2-lite": {
        "_name_or_path": "deepseek-ai/DeepSeek-V2-Lite",
        "model_type": "deepseek_v2",
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "hidden_size": 2048,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "torch_dtype": "bfloat16",
    },
}


def preset_layout(name: str, *, block_tokens: int = 16, dtype: str | None = None) -> KVLayout:
    """Layout of an embedded model preset; ConfigError names the valid presets."""
    try:
        config = PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"model preset {name!r} is unknown: use one of {', '.join(PRESETS)} "
            "or pass --model-config PATH"
        ) from None
    return KVLayout.from_hf_config(config, block_tokens=block_tokens, dtype=dtype, name=name)
