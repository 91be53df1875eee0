"""What the rank fork server imports once, so that forked ranks start warm
(fsbench.running.launch.forked says why). Imported by name by that server only: importing
it anywhere else would load every trainer's framework into that process.
"""
from __future__ import annotations

import importlib
import os

from fsbench.training.lifetime import die_with_parent

# The server must not outlive its launcher: its ranks hold the pipe whose end would tell
# it so (multiprocessing hands each child a copy), and each rank dies with the server.
die_with_parent()

# Rank code reads OMP_NUM_THREADS when torch loads, below: one thread per rank is the
# launcher's default, and the worker sets the run's own count before the first op.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# What every rank imports anyway, and the trainers' frameworks when installed (imported
# by name: fsbench does not depend on the baselines' packages). A failing import only
# means the rank imports it itself, as a cold rank would, and reports the error there.
WARM = ("torch", "fsbench.running.launch.worker", "torch._dynamo", "torch.nn.parallel",
        "freescale_impl.trainer", "baselines.torchrec_trainer", "baselines.deepspeed_trainer")
for _name in WARM:
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001 - see above
        pass
