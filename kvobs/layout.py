"""KV cache layout: how many bytes one token and one block of KV data take.

Standard attention (MHA/GQA) stores a key and a value vector per KV head per layer:
``2 x layers x kv_heads x head_dim x dtype_bytes`` per token. Multi-head latent
attention (MLA, DeepSeek-V2/V3) stores one compressed latent plus the rotary part per
layer: ``layers x (kv_lora_rank + qk_rope_head_dim) x dtype_bytes``.

Example:
    >>> layout = KVLayout.from_hf_config({
    ...     "num_hidden_layers": 32, "num_attention_heads": 32,
    ...     "num_key_value_heads": 8, "hidden_size": 4096, "torch_dtype": "bfloat16"})
    >>> layout.bytes_per_token, layout.bytes_per_block
    (131072, 2097152)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvobs.errors import ConfigError

DTYPE_BYTES: Mapping[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a KV cache dtype name (``"bfloat16"``, ``"fp8"``...)."""
    key = str(dtype).lower().removeprefix("torch.")
    try:
        return DTYPE_BYTES[key]
    except KeyError:
        raise ConfigError(
            f"dtype {dtype!r} is not supported: use one of {', '.join(sorted(DTYPE_BYTES))}"
        ) from None


@dataclass(frozen=True)
class KVLayout:
    """Shape of the KV data of one model, per token and per block.

    Args:
        num_layers: attention layers that keep KV cache.
        kv_heads: KV heads per layer (GQA groups); ignored for MLA.
        head_dim: size of one head's key (and value) vector; ignored for MLA.
        dtype: KV cache element type name.
        block_tokens: tokens per paged block (vLLM's ``block_size``).
        mla_latent_dim: for MLA, ``kv_lora_rank + qk_rope_head_dim``; None for MHA/GQA.
        name: a label for logs (the model name when known).
    """

    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    block_tokens: int = 16
    mla_latent_dim: int | None = None
    name: str = "custom"

    def __post_init__(self) -> None:
        for field in ("num_layers", "block_tokens"):
            _require_positive(field, getattr(self, field))
        if self.mla_latent_dim is None:
            _require_positive("kv_heads", self.kv_heads)
            _require_positive("head_dim", self.head_dim)
        else:
            _require_positive("mla_latent_dim", self.mla_latent_dim)
        dtype_bytes(self.dtype)

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (one latent per token per layer)."""
        return self.mla_latent_dim is not None

    @property
    def bytes_per_token_per_layer(self) -> int:
        """KV bytes one token occupies in one layer."""
        element = dtype_bytes(self.dtype)
        if self.mla_latent_dim is not None:
            return self.mla_latent_dim * element
        return 2 * self.kv_heads * self.head_dim * element

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token occupies across all layers."""
        return self.num_layers * self.bytes_per_token_per_layer

    @property
    def bytes_per_block(self) -> int:
        """KV bytes of one paged block across all layers."""
        return self.block_tokens * self.bytes_per_token

    @classmethod
    def from_hf_config(
        cls,
        config: Mapping[str, Any] | str | Path,
        *,
        block_tokens: int = 16,
        dtype: str | None = None,
        name: str | None = None,
    ) -> KVLayout:
        """Build a layout from a Hugging Face ``config.json`` (a dict or a path).

        Args:
            config: the parsed config, or the path of a ``config.json`` file.
            block_tokens: tokens per block.
            dtype: KV cache dtype; defaults to the config's ``torch_dtype``/``dtype``.
            name: label for logs; defaults to the config's ``_name_or_path`` or model type.

        Raises:
            ConfigError: the file is unreadable, not JSON, or lacks a needed field.
        """
        source = "model config"
        if not isinstance(config, Mapping):
            source = str(config)
            config = _read_json(Path(config))
        text = config.get("text_config")
        if "num_hidden_layers" not in config and isinstance(text, Mapping):
            config = {**config, **text}  # multimodal wrappers keep the LM under text_config
        layers = _require_int(config, "num_hidden_layers", source)
        chosen_dtype = dtype or str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        label = name or str(config.get("_name_or_path") or config.get("model_type") or "custom")
        if config.get("kv_lora_rank"):
            latent = _require_int(config, "kv_lora_rank", source) + _require_int(
                config, "qk_rope_head_dim", source
            )
            return cls(layers, 0, 0, chosen_dtype, block_tokens, latent, label)
        heads = _require_int(config, "num_attention_heads", source)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = config.get("head_dim")
        if not head_dim:
            head_dim = _require_int(config, "hidden_size", source) // heads
        return cls(layers, kv_heads, int(head_dim), chosen_dtype, block_tokens, None, label)


def _read_json(path: Path) -> Mapping[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"model config {path} does not exist: pass the path of a config.json"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"model config {path} cannot be read ({exc}): check the path") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"model config {path} is not valid JSON (line {exc.lineno}): "
            "pass a Hugging Face config.json"
        ) from None
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"model config {path} must be a JSON object: pass a Hugging Face config.json"
        )
    return data


def _require_int(config: Mapping[str, Any], field: str, source: str) -> int:
    value = config.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        problem = "is missing" if value is None else f"must be a positive integer, got {value!r}"
        raise ConfigError(
            f"{source}: field '{field}' {problem}: use the config.json of a decoder-only "
            "transformer (MHA/GQA, or MLA with kv_lora_rank and qk_rope_head_dim)"
        )
    return value


def _require_positive(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"KV layout field '{field}' must be a positive integer, got {value!r}")
