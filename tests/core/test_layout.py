"""KV layout math against bytes computed by hand from the published model configs."""

import json

import pytest

from kvobs.errors import ConfigError
from kvobs.layout import KVLayout
from kvobs.presets import PRESETS, preset_layout

LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
QWEN_25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("config", "per_token"),
    [
        # 2 (K,V) x 32 layers x 8 kv heads x 128 head_dim x 2 bytes
        (LLAMA_3_8B, 2 * 32 * 8 * 128 * 2),
        # 2 x 28 layers x 4 kv heads x (3584 / 28 = 128) x 2 bytes
        (QWEN_25_7B, 2 * 28 * 4 * 128 * 2),
        # MLA: 27 layers x (512 latent + 64 rope) x 2 bytes, no factor 2 for K/V
        (DEEPSEEK_V2_LITE, 27 * (512 + 64) * 2),
    ],
)
def test_bytes_per_token_matches_hand_computation(config, per_token):
    layout = KVLayout.from_hf_config(config)
    assert layout.bytes_per_token == per_token
    assert layout.bytes_per_block == 16 * per_token


def test_known_values():
    assert KVLayout.from_hf_config(LLAMA_3_8B).bytes_per_token == 131072
    assert KVLayout.from_hf_config(QWEN_25_7B).bytes_per_token == 57344
    deepseek = KVLayout.from_hf_config(DEEPSEEK_V2_LITE)
    assert deepseek.bytes_per_token == 31104 and deepseek.is_mla


def test_single_layer_block_is_64_kib_for_llama_3_8b():
    assert KVLayout.from_hf_config(LLAMA_3_8B).bytes_per_token_per_layer * 16 == 64 * 1024


def test_dtype_override_and_block_size():
    layout = KVLayout.from_hf_config(LLAMA_3_8B, dtype="fp8", block_tokens=32)
    assert layout.bytes_per_token == 65536
    assert layout.bytes_per_block == 32 * 65536


def test_explicit_head_dim_wins_over_hidden_size():
    config = {**QWEN_25_7B, "head_dim": 64}
    assert KVLayout.from_hf_config(config).bytes_per_token == 2 * 28 * 4 * 64 * 2


def test_missing_kv_heads_means_multi_head_attention():
    config = {k: v for k, v in LLAMA_3_8B.items() if k != "num_key_value_heads"}
    assert KVLayout.from_hf_config(config).bytes_per_token == 2 * 32 * 32 * 128 * 2


def test_multimodal_text_config_is_used():
    wrapper = {"model_type": "llava", "text_config": LLAMA_3_8B}
    assert KVLayout.from_hf_config(wrapper).bytes_per_token == 131072


def test_reads_config_json_from_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V2_LITE))
    assert KVLayout.from_hf_config(path).bytes_per_token == 31104


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({"model_type": "bert"}), "'num_hidden_layers' is missing"),
        (json.dumps({**LLAMA_3_8B, "num_hidden_layers": -2}), "must be a positive integer"),
        (
            json.dumps({**DEEPSEEK_V2_LITE, "qk_rope_head_dim": None}),
            "'qk_rope_head_dim' is missing",
        ),
        (json.dumps({**LLAMA_3_8B, "torch_dtype": "int4"}), "dtype 'int4' is not supported"),
    ],
)
def test_malformed_config_names_the_field(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        KVLayout.from_hf_config(path)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        KVLayout.from_hf_config(tmp_path / "nope.json")


def test_presets_build_and_unknown_preset_lists_choices():
    for name in PRESETS:
        assert preset_layout(name).bytes_per_token > 0
    with pytest.raises(ConfigError, match="llama-3-8b"):
        preset_layout("gpt-5")
