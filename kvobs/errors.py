"""Errors kvobs raises for bad input.

Every message names the offending field and says how to fix it; the CLI prints the
message on one line and exits non-zero instead of showing a traceback.
"""


class KvobsError(Exception):
    """Base class for errors caused by input that kvobs cannot use."""


class ConfigError(KvobsError, ValueError):
    """A configuration value (flag, environment variable, model config) is invalid.

    Example:
        >>> raise ConfigError("gpu_blocks must be > 0, got -1: pass --gpu-blocks N")
        Traceback (most recent call last):
        ...
        kvobs.errors.ConfigError: gpu_blocks must be > 0, got -1: pass --gpu-blocks N
    """


class UnknownTierError(KvobsError, KeyError):
    """A tier name that was never registered with the recorder."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""
