"""How a process of the project starts: with Python's cyclic garbage collector paused while it imports torch and
the project's modules, then with everything those imports made kept out of later collections.

Importing torch, and torch._dynamo, which torch.optim imports with the first optimizer, creates about half a million
objects that live as long as the process. While they are made, the collector scans them again at every full
collection: about 0.6 CPU-s a rank on a 2-core machine, a sixth of its start-up. None of them is garbage, so the
collector sleeps through the imports and `gc.freeze()` then takes them out of its sight for good. It wakes before
anything of the user's (data, model, script) is built: what the process allocates from then on is collected as
usual, and only the few cycles the imports themselves left behind are never freed.
"""

from __future__ import annotations

import gc


def pause_collector() -> None:
    """Stop automatic garbage collection until `resume_collector()`: call it before the imports."""
    gc.disable()


def resume_collector() -> None:
    """After the imports: keep every object allocated so far out of later collections, and collect automatically
    again."""
    gc.freeze()
    gc.enable()
