"""What a bad KV layout or model config says (:mod:`kvobs.layout`): the field named, the
config's path, the fix. Each case is one a mutant of the module got past the older tests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvobs.errors import ConfigError
from kvobs.layout import KVLayout

LLAMA = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "hidden_size": 4096}


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"num_layers": 0, "kv_heads": 8, "head_dim": 128}, "num_layers"),
        ({"num_layers": 2, "kv_heads": 8, "head_dim": 128, "block_tokens": 0}, "block_tokens"),
        ({"num_layers": 2, "kv_heads": 0, "head_dim": 128}, "kv_heads"),
        ({"num_layers": 2, "kv_heads": 8, "head_dim": -1}, "head_dim"),
        ({"num_layers": 2, "kv_heads": 0, "head_dim": 0, "mla_latent_dim": 0},
         "mla_latent_dim"),
    ],
)
def test_a_layout_field_that_is_not_positive_is_named(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        KVLayout(**kwargs)  # type: ignore[arg-type]
    assert str(caught.value).startswith(f"KV layout field '{field}' must be a positive integer")


def test_a_config_given_as_a_mapping_is_called_model_config() -> None:
    with pytest.raises(ConfigError) as caught:
        KVLayout.from_hf_config({"num_attention_heads": 8})
    assert str(caught.value).startswith("model config: field 'num_hidden_layers' is missing")


def test_a_config_read_from_a_file_names_its_path(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "num_hidden_layers": 0}))
    with pytest.raises(ConfigError) as caught:
        KVLayout.from_hf_config(path)
    assert str(caught.value).startswith(
        f"{path}: field 'num_hidden_layers' must be a positive integer, got 0")
    path.write_text(json.dumps(LLAMA))
    assert KVLayout.from_hf_config(str(path)).bytes_per_token == 131072


def test_a_config_file_that_is_missing_unreadable_or_not_an_object(tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    with pytest.raises(ConfigError, match=re.escape(
            f"model config {missing} does not exist: pass the path of a config.json")):
        KVLayout.from_hf_config(missing)
    with pytest.raises(ConfigError, match=re.escape(
            f"model config {tmp_path} cannot be read (")) as caught:
        KVLayout.from_hf_config(tmp_path)  # a directory
    assert str(caught.value).endswith("): check the path")
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "num_hidden_layers": 2,\n  oops\n}')
    with pytest.raises(ConfigError, match=re.escape(
            f"model config {broken} is not valid JSON (line 3): pass a Hugging Face "
            "config.json")):
        KVLayout.from_hf_config(broken)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match=re.escape(f"model config {binary} cannot be read")):
        KVLayout.from_hf_config(binary)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=re.escape(
            f"model config {listed} must be a JSON object: pass a Hugging Face config.json")):
        KVLayout.from_hf_config(listed)
