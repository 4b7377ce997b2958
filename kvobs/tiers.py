"""Names of KV cache tiers.

A tier is a pool of KV blocks that lives in one kind of memory. kvobs knows the usual
three and accepts more (``remote``, ``cxl``...) as long as the name is a short,
lowercase Prometheus-label-safe identifier: tier names end up as label values, so they
must stay few and stable.

Example:
    >>> from kvobs.tiers import GPU, HOST, validate_tier_name
    >>> (GPU, HOST)
    ('gpu', 'host')
    >>> validate_tier_name("remote")
    'remote'
"""

import re

from kvobs.errors import ConfigError

GPU = "gpu"
HOST = "host"
DISK = "disk"

#: A tier's role: ``primary`` holds running requests' KV (every running request needs
#: blocks there, so it bounds concurrency); ``cache`` keeps reusable copies only.
PRIMARY = "primary"
CACHE = "cache"
ROLES: tuple[str, ...] = (PRIMARY, CACHE)

#: Tiers in the order reports list them: fastest first.
KNOWN_TIERS: tuple[str, ...] = (GPU, HOST, DISK)

_TIER_NAME = re.compile(r"^[a-z][a-z0-9_]{0,15}$")


def validate_tier_name(name: str) -> str:
    """Return ``name`` if it can be a tier label value, else raise ConfigError."""
    if not isinstance(name, str) or not _TIER_NAME.match(name):
        raise ConfigError(
            f"tier name {name!r} is invalid: use 1-16 lowercase letters, digits or '_' "
            f"starting with a letter (known tiers: {', '.join(KNOWN_TIERS)})"
        )
    return name


def tier_order(name: str) -> int:
    """Sort key that lists known tiers fastest-first and others after them."""
    return KNOWN_TIERS.index(name) if name in KNOWN_TIERS else len(KNOWN_TIERS)


def default_role(name: str) -> str:
    """The usual role of tier ``name``: the GPU is primary, every other tier a cache
    (an engine whose host pool is its primary store, vLLM HiSparse, says so)."""
    return PRIMARY if name == GPU else CACHE
