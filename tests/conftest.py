"""Cross-package and end-to-end tests never reach a model hub (``tiny_checkpoint`` comes from
``vllm_tt_testing.fixtures``)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
