"""Which fields of a Hugging Face ``config.json`` :meth:`kvobs.layout.KVLayout.from_hf_config`
reads: a multimodal wrapper's ``text_config``, the dtype (``torch_dtype``, then ``dtype``,
then bfloat16, an explicit one over all), the name, and the GQA and MLA shapes."""

from __future__ import annotations

from typing import Any

import pytest

from kvobs.errors import ConfigError
from kvobs.layout import KVLayout

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
    assert layout.bytes_per_token == 61 * 576 * 2
