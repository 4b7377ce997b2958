"""Shared by every test directory: this file puts ``tests/`` on ``sys.path`` so that
helper modules such as :mod:`required` import from any of them."""
