"""A chat tokenizer for the test model, built on the spot (no network, no hub).

``vllm serve`` answers ``/v1/chat/completions`` only for a model whose tokenizer has a
chat template. :func:`make_chat_tokenizer` writes one into the model's folder: a
word-level vocabulary exactly the model's ``vocab_size`` long (``<unk>``, ``<s>``,
``</s>`` first, so that Llama's default ``bos_token_id`` 1 and ``eos_token_id`` 2 are
the tokenizer's), split on whitespace, decoded with spaces between words, and a Jinja
template that writes each message as ``<s> ROLE CONTENT </s>``. Text made of its words
round-trips: a reply sent back as the next turn's history is the same tokens again, so
a returning chat's earlier turns are prefix-cache hits.

Example::

    make_chat_tokenizer(model_dir, vocab_size=512)
    words(random.Random(0), 20)   # 'w17 w301 ...': 20 tokens of prompt text
"""

from __future__ import annotations

import random
from pathlib import Path

SPECIALS = ("<unk>", "<s>", "</s>")
ROLES = ("system", "user", "assistant")
CHAT_TEMPLATE = ("{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> "
                 "{% endfor %}{% if add_generation_prompt %}<s> assistant {% endif %}")


def vocabulary(vocab_size: int) -> list[str]:
    """Every token, in id order: the special tokens, the roles, then ``w0``, ``w1``..."""
    plain = vocab_size - len(SPECIALS) - len(ROLES)
    return [*SPECIALS, *ROLES, *(f"w{i}" for i in range(plain))]


def make_chat_tokenizer(folder: Path, vocab_size: int) -> Path:
    """Write the tokenizer files (``tokenizer.json``, its config with the chat template)
    into ``folder``, next to the model's ``config.json``."""
    if (folder / "tokenizer_config.json").exists():
        return folder
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: n for n, token in enumerate(vocabulary(vocab_size))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # words joined by spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<unk>", chat_template=CHAT_TEMPLATE, model_max_length=1 << 16)
    tokenizer.save_pretrained(folder)
    return folder


def words(rnd: random.Random, count: int) -> str:
    """``count`` plain words of the vocabulary (one token each), chosen by ``rnd``."""
    return " ".join(f"w{rnd.randrange(0, 400)}" for _ in range(count))
