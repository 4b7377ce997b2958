"""Import-time stand-in for torchvision in kvobs's SGLang test venv.

SGLang's host KV pools import multimodal helpers that reference torchvision at module
level but never call it on this path. Every ``torchvision.*`` submodule resolves to a
package whose attributes are inert placeholders.
"""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.29.0"


class _Anything:
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __mro_entries__(self, bases):
        return (object,)


def _module_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Anything()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr
        return module

    def exec_module(self, module):
        return None


sys.meta_path.append(_StubFinder())
__getattr__ = _module_getattr
