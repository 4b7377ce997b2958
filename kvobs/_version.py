"""kvobs's release, in a module that imports nothing: ``kvobs.__version__``, ``kvobs
--version`` and the ``service.version`` that ``/metrics`` (``target_info``) and OTLP (the
resource) report all read it here, so no layer imports the package's front door for it."""

__version__ = "0.1.0"
