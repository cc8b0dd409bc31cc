"""User factories named by import path: `--model package.module:function`, `--model torchvision:NAME`,
`--dataset package.module:function`.

A factory is imported from the working directory or the installed packages and called with keyword
arguments on every rank before any collective. Whatever goes wrong (the import, the attribute, the
call) is a one-line UsageError naming the factory, the problem and where it happened.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib
import inspect
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from common.errors import UsageError

TORCHVISION = "torchvision"


def is_factory(name: str) -> bool:
    """Whether an option value names a factory by import path (it has a colon) rather than a built-in."""
    return ":" in name


def parse_literals(pairs: Sequence[str]) -> Dict[str, Any]:
    """KEY=VALUE texts -> {KEY: value}: values are Python literals (3, 0.1, True, None, (1, 2), 'x');
    anything that is not a literal is kept as a string (gelu)."""
    out: Dict[str, Any] = {}
    for pair in pairs:
        key, _, text = pair.partition("=")
        try:
            out[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[key] = text
    return out


def source_record(spec: str, function: Callable) -> Dict[str, Optional[str]]:
    """What config.json says about a factory: its import path, the file that defines it and that file's
    SHA-256 (runs whose factories differ are not compared)."""
    try:
        path = inspect.getsourcefile(inspect.unwrap(function))
    except TypeError:  # a builtin or a C extension
        path = None
    digest = None
    if path and os.path.isfile(path):
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    return {"spec": spec, "source": os.path.abspath(path) if path else None, "sha256": digest}


@dataclass(frozen=True)
class Factory:
    """An imported factory: `spec` names it, `option` is the flag that named it (for messages)."""

    spec: str
    option: str
    function: Callable

    def record(self) -> Dict[str, Optional[str]]:
        """Import path, source file and its SHA-256."""
        return source_record(self.spec, self.function)

    def call(self, **kwargs) -> Any:
        """Call the factory; an exception it raises becomes one line with the place it was raised."""
        try:
            return self.function(**kwargs)
        except UsageError:
            raise
        except Exception as exc:  # whatever user code raises is reported, not a traceback
            raise UsageError(f"{self.option} {self.spec} raised {describe_exception(exc)}") from None


def describe_exception(exc: BaseException) -> str:
    """`TypeError: message (at file.py:12 in build)`, on one line. The place is the innermost frame of the
    user's own code (not an installed package's, not the import machinery's), when there is one."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    own = [f for f in traceback.extract_tb(exc.__traceback__)
           if not f.filename.startswith("<") and not _installed(f.filename)]
    if own:
        last = own[-1]
        path = os.path.abspath(last.filename)
        shown = os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path
        text += f" (at {shown}:{last.lineno} in {last.name})"
    return text


def _installed(path: str) -> bool:
    """Whether a source file belongs to an installed package, the standard library or this package."""
    path = os.path.abspath(path)
    parts = path.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts or path.startswith(
        (sys.base_prefix + os.sep, os.path.dirname(os.path.abspath(__file__)) + os.sep))


def article(value) -> str:
    """'a list', 'an int': how a value's type reads in a message."""
    name = type(value).__name__
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def load(spec: str, option: str) -> Factory:
    """Import `package.module:function` (its form already checked by the option's parser; the working
    directory first, as `python -m` does)."""
    module_name, attribute = spec.split(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is the plugin's
        raise UsageError(f"{option} {spec}: cannot import {module_name!r}: {describe_exception(exc)}; run from the "
                         "folder that holds it or install it") from None
    function = getattr(module, attribute, None)
    if function is None:
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        close = difflib.get_close_matches(attribute, names, n=3)
        hint = (f"; did you mean {', '.join(close)}?" if close
                else f"; it defines {', '.join(names[:8]) or 'nothing callable'}")
        raise UsageError(f"{option} {spec}: module {module_name!r} ({getattr(module, '__file__', '?')}) has no "
                         f"{attribute!r}{hint}")
    if not callable(function):
        raise UsageError(f"{option} {spec}: {attribute!r} is a {type(function).__name__}, not a function")
    return Factory(spec, option, function)


def torchvision_models() -> List[str]:
    """The names of torchvision's classification models (not detection, segmentation or video)."""
    import torchvision.models

    return torchvision.models.list_models(module=torchvision.models)


def torchvision_factory(name: str) -> Factory:
    """torchvision's builder of classification model `name`, random init; UsageError listing close matches."""
    import torchvision.models

    names = torchvision_models()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
        hint = f"close matches: {', '.join(close)}" if close else f"e.g. {', '.join(names[:5])}"
        raise UsageError(f"--model {TORCHVISION}:{name}: torchvision {torchvision.__version__} has no classification "
                         f"model {name!r}; {hint}")
    builder = torchvision.models.get_model_builder(name)

    def build(num_classes: int, channels: int, image_size: int, **kwargs):
        if channels != 3:
            raise UsageError(f"--model {TORCHVISION}:{name} takes 3-channel images, the dataset gives {channels}; "
                             "use a 3-channel dataset (synthetic, cifar10, imagefolder)")
        return builder(weights=None, num_classes=num_classes, **kwargs)

    build.__dict__["__wrapped__"] = builder  # its record names torchvision's source file (inspect.unwrap)
    return Factory(f"{TORCHVISION}:{name}", "--model", build)
