"""Functions named by module path, as spawned worker processes can find them.

A worker is a separate process: it can import `package.module:function` from a file on the
path, never an object that lives only in the parent's `__main__` (a notebook cell, the script
being run) or inside another function. Everything handed to the workers by name — a function
for `cluster.call`, the three functions of a `pl.CustomModel` — is checked here, in the parent,
so a bad name is refused before any worker moves. `who` starts each message ("cluster.call").
"""
from __future__ import annotations

import importlib
from typing import Callable


def function_name(target: "str | Callable", who: str) -> str:
    """'package.module:function' for `target` (a name or a function), or ValueError saying why
    the workers could not import it."""
    if callable(target) and not isinstance(target, str):
        module = getattr(target, "__module__", None)
        qualname = getattr(target, "__qualname__", None)
        if module is None or qualname is None:
            raise ValueError(f"{who}: {target!r} has no module and name; pass a function "
                             f"defined at the top level of an importable module")
        name = f"{module}:{qualname}"
    elif isinstance(target, str):
        name = target
    else:
        raise ValueError(f"{who}: must be 'module:function' or a function, "
                         f"got {type(target).__name__}")
    module, sep, qualname = name.partition(":")
    if not sep or not module or not qualname:
        raise ValueError(f"{who}: {name!r} is not 'package.module:function'")
    if module == "__main__" or module.startswith("__mp_main__"):
        raise ValueError(
            f"{who}: {qualname} is defined in __main__ (a notebook cell or the script "
            f"being run); the workers are separate processes that cannot see it. Move it to a "
            f"module they can import (a .py file next to the notebook or in your package) and "
            f"name it as 'module:{qualname}'")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(f"{who}: {name} is a local function or a lambda; the workers can "
                         f"only import functions defined at the top level of a module")
    resolve(name, who)       # importable here, or a clear error before any worker moves
    return name


def resolve(name: str, who: str = "resolve") -> Callable:
    """Import `module:qualname` and return the function (ValueError if it does not exist)."""
    module_name, _, qualname = name.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{who}: cannot import module {module_name!r} ({err}); the "
                         f"workers import it by name, so it must be importable (a .py file "
                         f"on the path, e.g. next to the notebook)") from None
    except SystemExit as err:          # a module that calls sys.exit() when imported
        raise ValueError(f"{who}: importing module {module_name!r} called sys.exit({err.code}); "
                         f"keep a script's top-level code under `if __name__ == '__main__':`") \
            from None
    except Exception as err:           # a SyntaxError, or anything its top-level code raised
        where = f" (line {err.lineno})" if isinstance(err, SyntaxError) and err.lineno else ""
        raise ValueError(f"{who}: module {module_name!r} failed to import: "
                         f"{type(err).__name__}{where}: {err}") from err
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{who}: module {module_name!r} has no {qualname!r}") from None
    if not callable(obj):
        raise ValueError(f"{who}: {name} is a {type(obj).__name__}, not a function")
    return obj
