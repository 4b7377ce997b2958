"""Options shared by subcommands that need a KV layout: a config.json or a preset."""

from __future__ import annotations

import argparse
from typing import Any

from kvobs.cli.options import add_option, at_most, input_file, positive_int
from kvobs.errors import ConfigError
from kvobs.layout import KVLayout
from kvobs.presets import PRESETS, preset_layout


def add_model_options(parser: argparse.ArgumentParser, default_preset: str | None) -> None:
    """Add --model-config / --model / --block-size / --kv-dtype."""
    group = parser.add_mutually_exclusive_group()
    add_option(
        group,
        "--model-config",
        type=input_file,
        help="Hugging Face config.json of the model",
        metavar="PATH",
    )
    add_option(
        group,
        "--model",
        default=default_preset,
        metavar="PRESET",
        help=f"embedded model preset ({', '.join(PRESETS)})",
    )
    add_option(
        parser,
        "--block-size",
        type=at_most(positive_int, 2**16),
        default=16,
        help="tokens per KV block",
    )
    add_option(
        parser,
        "--kv-dtype",
        default=None,
        help="KV cache dtype (bfloat16, float16, fp8...); default: the model's dtype",
    )


def layout_from_args(args: Any) -> KVLayout:
    """The layout the options describe (ConfigError for a bad file or preset)."""
    try:
        if args.model_config:
            return KVLayout.from_hf_config(
                args.model_config, block_tokens=args.block_size, dtype=args.kv_dtype
            )
        if not args.model:
            raise ConfigError("no model given: pass --model-config PATH or --model PRESET")
        return preset_layout(args.model, block_tokens=args.block_size, dtype=args.kv_dtype)
    except ConfigError as exc:
        flag = "--model-config" if args.model_config else "--model"
        message = str(exc)
        if args.kv_dtype and message.startswith("dtype"):
            flag = "--kv-dtype"
        raise ConfigError(message if message.startswith("--") else f"{flag}: {message}") from None
