"""Which fields of a Hugging Face ``config.json`` :meth:`kvobs.layout.KVLayout.from_hf_config`
reads: a multimodal wrapper's ``text_config``, the dtype (``torch_dtype``, then ``dtype``,
then bfloat16, an explicit one over all), the name, and the GQA and MLA shapes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvobs.errors import ConfigError
from kvobs.layout import DTYPE_BYTES, KVLayout, dtype_bytes

LM = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
      "head_dim": 128, "hidden_size": 2048}


def test_a_multimodal_wrappers_language_model_is_under_text_config() -> None:
    config = {"model_type": "qwen2_5_vl", "_name_or_path": "Qwen/Qwen2.5-VL-3B",
              "torch_dtype": "float16", "vision_config": {"num_hidden_layers": 32},
              "text_config": LM}
    layout = KVLayout.from_hf_config(config)
    assert (layout.num_layers, layout.kv_heads, layout.head_dim) == (28, 8, 128)
    assert (layout.dtype, layout.name) == ("float16", "Qwen/Qwen2.5-VL-3B")  # the wrapper's
    assert layout.bytes_per_token == 2 * 28 * 8 * 128 * 2


def test_text_configs_fields_win_over_the_wrappers() -> None:
    config = {"model_type": "gemma3", "torch_dtype": "float32", "num_attention_heads": 4,
              "text_config": {**LM, "torch_dtype": "bfloat16", "model_type": "gemma3_text"}}
    layout = KVLayout.from_hf_config(config)
    assert (layout.kv_heads, layout.dtype, layout.name) == (8, "bfloat16", "gemma3_text")


def test_a_config_with_its_own_layers_ignores_text_config() -> None:
    config = {**LM, "num_hidden_layers": 4, "text_config": {**LM, "num_hidden_layers": 99}}
    assert KVLayout.from_hf_config(config).num_layers == 4


@pytest.mark.parametrize("text_config", [None, "qwen", ["num_hidden_layers", 28]])
def test_a_text_config_that_is_not_an_object_is_not_read(text_config: Any) -> None:
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        KVLayout.from_hf_config({"model_type": "x", "text_config": text_config})


@pytest.mark.parametrize(("fields", "dtype"), [
    ({"torch_dtype": "float16", "dtype": "float32"}, "float16"),
    ({"dtype": "float32"}, "float32"),
    ({"torch_dtype": None, "dtype": "float32"}, "float32"),
    ({"torch_dtype": "", "dtype": "float8_e4m3fn"}, "float8_e4m3fn"),
    ({}, "bfloat16"),
    ({"torch_dtype": None, "dtype": None}, "bfloat16"),
])
def test_the_dtype_is_torch_dtype_then_dtype_then_bfloat16(
        fields: dict[str, Any], dtype: str) -> None:
    assert KVLayout.from_hf_config({**LM, **fields}).dtype == dtype


def test_an_explicit_dtype_wins_over_the_configs() -> None:
    config = {**LM, "torch_dtype": "float16", "dtype": "float32"}
    assert KVLayout.from_hf_config(config, dtype="float8_e5m2").dtype == "float8_e5m2"


@pytest.mark.parametrize(("fields", "name"), [
    ({"_name_or_path": "org/model", "model_type": "llama"}, "org/model"),
    ({"_name_or_path": "", "model_type": "llama"}, "llama"),
    ({"model_type": "llama"}, "llama"),
    ({}, "custom"),
])
def test_the_name_is_the_path_then_the_model_type_then_custom(
        fields: dict[str, Any], name: str) -> None:
    assert KVLayout.from_hf_config({**LM, **fields}).name == name
    assert KVLayout.from_hf_config({**LM, **fields}, name="mine").name == "mine"


def test_kv_heads_default_to_the_attention_heads_and_head_dim_to_hidden_over_heads() -> None:
    config = {"num_hidden_layers": 2, "num_attention_heads": 16, "hidden_size": 2048,
              "num_key_value_heads": None, "head_dim": 0}
    layout = KVLayout.from_hf_config(config, block_tokens=32)
    assert (layout.kv_heads, layout.head_dim, layout.block_tokens) == (16, 128, 32)


def test_an_mla_config_keeps_the_latent_and_its_rope_part() -> None:
    config = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
              "num_attention_heads": 128, "torch_dtype": "bfloat16", "model_type": "deepseek_v3"}
    layout = KVLayout.from_hf_config(config)
    assert (layout.mla_latent_dim, layout.kv_heads, layout.head_dim) == (576, 0, 0)
    assert layout.name == "deepseek_v3"
    assert KVLayout.from_hf_config(config, name="ds").name == "ds"
    assert layout.bytes_per_token == 61 * 576 * 2


def test_an_mla_configs_missing_rope_part_is_named_with_the_config() -> None:
    config = {"num_hidden_layers": 61, "kv_lora_rank": 512, "num_attention_heads": 128}
    with pytest.raises(ConfigError) as raised:
        KVLayout.from_hf_config(config)
    assert str(raised.value) == (
        "model config: field 'qk_rope_head_dim' is missing: use the config.json of a "
        "decoder-only transformer (MHA/GQA, or MLA with kv_lora_rank and qk_rope_head_dim)")
    with pytest.raises(ConfigError, match=r"^model config: field 'kv_lora_rank' must be a "
                                          r"positive integer, got 512\.0: use"):
        KVLayout.from_hf_config({**config, "kv_lora_rank": 512.0, "qk_rope_head_dim": 64})


def test_one_of_everything_is_a_layout() -> None:
    config = {"num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
              "head_dim": 1}
    layout = KVLayout.from_hf_config(config, block_tokens=1, dtype="float8_e4m3fn")
    assert (layout.bytes_per_token, layout.bytes_per_block) == (2, 2)
    assert KVLayout(1, 1, 1, "float8_e4m3fn", 1).bytes_per_block == 2
    assert KVLayout(1, 0, 0, "float8_e4m3fn", 1, mla_latent_dim=1).bytes_per_block == 1


@pytest.mark.parametrize("bad", [True, 0, 1.0])
def test_a_layout_field_that_is_a_bool_zero_or_float_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match=re.escape(
            f"KV layout field 'num_layers' must be a positive integer, got {bad!r}")):
        KVLayout(bad, 8, 128)  # type: ignore[arg-type]


def test_a_head_dim_of_its_own_wins_over_hidden_size_over_heads() -> None:
    """As Gemma's: a head_dim (256) other than hidden_size / heads (3072 / 8 = 384)."""
    config = {**LM, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
              "hidden_size": 3072}
    assert KVLayout.from_hf_config(config).head_dim == 256
    assert KVLayout.from_hf_config({**config, "head_dim": None}).head_dim == 384


@pytest.mark.parametrize("field", ["num_attention_heads", "hidden_size"])
def test_a_missing_attention_field_is_named_with_the_config_file(
        field: str, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    del config[field]
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=re.escape(f"{path}: field '{field}' is missing: use")):
        KVLayout.from_hf_config(path)


@pytest.mark.parametrize(("dtype", "size"), [
    ("torch.float16", 2), ("TORCH.BFLOAT16", 2), ("Float32", 4), ("fp8", 1)])
def test_a_dtype_may_be_torchs_name_in_any_case(dtype: str, size: int) -> None:
    assert dtype_bytes(dtype) == size


@pytest.mark.parametrize("dtype", ["float16.torch", "torch_float16", "int4"])
def test_another_dtype_is_refused_with_the_list(dtype: str) -> None:
    with pytest.raises(ConfigError) as raised:
        dtype_bytes(dtype)
    assert str(raised.value) == (f"dtype {dtype!r} is not supported: use one of "
                                 + ", ".join(sorted(DTYPE_BYTES)))
    assert "bf16, bfloat16, float" in str(raised.value)
