"""The check's steps, one module each (the DDP runs of steps 1 and 2 together), and what they share: base.py (what
a step is to the runner), training.py (a ddp_train run and its checks), probe.py, horovod.py."""

from __future__ import annotations

from .base import BackgroundStep, Step
from .compare import Compare
from .ddp import AmpBf16, AmpFp16, ChannelsLast, Ddp
from .exact import Exact
from .horovod_api import HorovodApi
from .horovod_build import HorovodBuild
from .install import Install

#: each step of spec.STEPS by name
ACTIONS: dict[str, Step | BackgroundStep] = {
    "install": Install(), "ddp": Ddp(), "amp_fp16": AmpFp16(), "amp_bf16": AmpBf16(), "channels_last": ChannelsLast(),
    "exact": Exact(), "horovod_api": HorovodApi(), "horovod_build": HorovodBuild(), "compare": Compare(),
}
