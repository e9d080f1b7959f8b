"""The registered analyses of a llama-server log. Each sees every task once, beside the tasks that ran
with it (`reader.py`), keeps compact aggregates, and reports its findings at the end: a finding only
where something cost the users time, so a clean log yields none.

The mechanisms are those of the source case study (serving-engines.md §1.6): each loop iteration gives
every decoding slot one token and fills the rest of the batch, up to n_batch, with prompt tokens, so a
stream decodes at about prefill speed / n_batch while another slot prefills; a slot whose LoRA setting
differs from the batch's is left out of it, so a request waits before its prefill starts, and that wait
is in no server timing.

One module per analysis (`stalls`, `waits`, `long_prefills`, `queueing`, `lora_switch`), registered in
that order by `base.analysis` when imported here; an analysis may read an earlier one's results
(`long_prefills` reads the stall windows).
"""

from __future__ import annotations

# Imported in the order the analyses run: each registers itself.
from tuner.diagnose.analyses import stalls, waits, long_prefills, queueing, lora_switch  # isort: skip  # noqa: F401
from tuner.diagnose.analyses.base import ANALYSES, Reporting, analysis, new_analyses
from tuner.diagnose.analyses.long_prefills import LongPrefills
from tuner.diagnose.analyses.lora_switch import LoraSwitch
from tuner.diagnose.analyses.queueing import Queueing
from tuner.diagnose.analyses.stalls import Stalls
from tuner.diagnose.analyses.waits import Waits

__all__ = [
    "ANALYSES",
    "LongPrefills",
    "LoraSwitch",
    "Queueing",
    "Reporting",
    "Stalls",
    "Waits",
    "analysis",
    "new_analyses",
]
