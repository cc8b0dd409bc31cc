"""How a process of the project starts: with Python's cyclic garbage collector paused while it imports torch and
builds its job, then with everything start-up made kept out of later collections.

Importing torch, and torch._dynamo, which torch.optim imports when the first optimizer is built, creates about
half a million objects that live as long as the process. While they are made, the collector scans them again at
every full collection: about 0.6 CPU-s a rank on a 2-core machine, a sixth of its start-up. None of them is
garbage, so the collector sleeps through start-up and `gc.freeze()` then takes them out of its sight for good;
what the process allocates afterwards is collected as usual. The price is that the few cycles start-up itself
leaves behind are never freed: a one-time amount, not a growing one.
"""

from __future__ import annotations

import gc


def pause_collector() -> None:
    """Stop automatic garbage collection until `resume_collector()`: call it before the heavy imports."""
    gc.disable()


def resume_collector() -> None:
    """End start-up: keep every object allocated so far out of later collections, and collect automatically
    again."""
    gc.freeze()
    gc.enable()
