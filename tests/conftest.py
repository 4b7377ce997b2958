"""The tests are packages (``tests/__init__.py`` and one per directory), collected with
``--import-mode=importlib`` (pyproject.toml): a helper is imported by its full name, e.g.
``from tests.required import missing`` or ``from tests.telemetry.scripted import
scripted_recorder``, from any directory and any engine venv, without ``sys.path`` edits."""
