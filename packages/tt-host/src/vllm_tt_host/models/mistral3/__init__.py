"""Mistral 3: the Mistral decoder with the Pixtral tower and a patch-merging projector."""

from __future__ import annotations

from vllm_tt_host.models.frame.family import DECODER, HostFamily

FAMILY = HostFamily(
    __name__,
    models={
        "TTMistral3ForConditionalGeneration": "model:HostMistral3ForConditionalGeneration",
    },
    tiny=("vllm_tt_testing.tiny_mistral3",),
    capabilities={"TTMistral3ForConditionalGeneration": DECODER},
)
