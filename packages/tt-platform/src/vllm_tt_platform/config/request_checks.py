"""Per-request checks, the one place a request is refused: sampling features the TT backend
cannot honour are rejected when the request arrives (HTTP 400 from the API server), never
silently ignored mid-generation. Whole features are refused at startup (``startup_checks``).

vLLM calls ``Platform.validate_request(inputs, params)`` with no config, in the front-end
process. ``configure`` (which vLLM runs in every process, front end included) therefore
installs the served model's ``RequestRules`` here; ``check_request`` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.exceptions import VLLMValidationError
from vllm_tt_models_registry.capabilities import MODALITIES
from vllm_tt_models_registry.contract import ModelCapabilities

from vllm_tt_platform.errors import TTUnsupportedFeatureError


class TTUnsupportedRequestError(VLLMValidationError):
    """A request asks for a sampling feature the TT backend (or the served model) lacks."""


@dataclass(frozen=True)
class RequestRules:
    """What the served model allows per request."""

    arch: str
    prompt_logprobs: bool
    """The model declares ``supports_prompt_logprobs``."""
    image_tokens_per_pass: int | None = None
    """Most prompt tokens one image may span (placeholders, and with Gemma 3's pan-and-scan the
    crops and the text between them): images are never split over prefill chunks, so a longer
    one could never be scheduled and would wait forever. None: not a multimodal model."""
    pooling_max_len: int | None = None
    """A pooling model's longest program shape (``pooling_shapes``): the longest prompt it
    takes. None: a generation model."""

    @classmethod
    def of(cls, arch: str, caps: ModelCapabilities, image_tokens_per_pass: int | None = None,
           pooling_max_len: int | None = None) -> RequestRules:
        return cls(arch=arch, prompt_logprobs=caps.supports_prompt_logprobs,
                   image_tokens_per_pass=image_tokens_per_pass, pooling_max_len=pooling_max_len)


_installed: RequestRules | None = None


def install(rules: RequestRules) -> None:
    """Set the rules of the model this process serves (``configure`` calls it)."""
    global _installed
    _installed = rules


def check_images(processed_inputs: Any, rules: RequestRules | None = None) -> None:
    """Refuse an image whose placeholder span is longer than one prefill pass may be (before the
    engine sees it: vLLM's scheduler would keep such a request waiting forever)."""
    rules = _installed if rules is None else rules
    placeholders = processed_inputs.get("mm_placeholders") if isinstance(processed_inputs, dict) else None
    if rules is None or rules.image_tokens_per_pass is None or not placeholders:
        return
    limit = rules.image_tokens_per_pass
    for modality in MODALITIES:
        for index, span in enumerate(placeholders.get(modality, ())):
            if span.length > limit:
                raise TTUnsupportedRequestError(
                    f"{modality} {index} of the request spans {span.length} prompt tokens (its "
                    f"placeholders, with pan-and-scan its crops, with a video its frames and the text "
                    f"between them), more than one prefill pass of {rules.arch} takes ({limit}: "
                    f"{modality}s are never split over prefill chunks). Send a smaller {modality}, fewer "
                    f"crops or frames, or serve with --max-num-batched-tokens of at least {span.length}.",
                    parameter=modality, value=span.length,
                )


def check_pooling_prompt(processed_inputs: Any, rules: RequestRules | None = None) -> None:
    """Refuse a pooling prompt longer than the longest program shape (it could never run: the
    device runs captured shapes only), naming the limit and the option that raises it."""
    rules = _installed if rules is None else rules
    if rules is None or rules.pooling_max_len is None or not isinstance(processed_inputs, dict):
        return
    tokens = processed_inputs.get("prompt_token_ids")
    if tokens is not None and len(tokens) > rules.pooling_max_len:
        raise TTUnsupportedRequestError(
            f"the input is {len(tokens)} tokens long, longer than the longest pooling shape of "
            f"{rules.arch} ({rules.pooling_max_len} tokens). Shorten the input (or send "
            f"truncate_prompt_tokens), or serve with a longer shape in "
            f"--additional-config.tt.pooling_shapes (up to --max-model-len).",
            parameter="input", value=len(tokens),
        )


def check_request(params: Any, rules: RequestRules | None = None) -> None:
    """Raise ``TTUnsupportedRequestError`` for a request the backend would not honour, and
    ``TTUnsupportedFeatureError`` for one that is not a generation request at all.

    ``rules`` defaults to the installed ones; with none installed, model-specific checks are
    skipped (the worker's checks still apply)."""
    from vllm.sampling_params import SamplingParams

    rules = _installed if rules is None else rules
    if rules is not None and rules.pooling_max_len is not None:
        if isinstance(params, SamplingParams):
            raise TTUnsupportedRequestError(
                f"{rules.arch} is a pooling model (served with --runner pooling): it computes "
                "embeddings, it does not generate text. Send embedding requests (/v1/embeddings, "
                "/pooling, LLM.embed), or serve a generative model for generation.",
                parameter="request", value=type(params).__name__,
            )
        return
    if not isinstance(params, SamplingParams):
        raise TTUnsupportedFeatureError(
            "request", type(params).__name__, "a generation request (SamplingParams)",
            "this server runs a generative model; serve a pooling model with --runner pooling "
            "for pooling requests (docs/pooling.md)",
        )
    if params.allowed_token_ids and params.structured_outputs is not None:
        # A grammar that allows none of the listed tokens leaves nothing to sample; vLLM then
        # ends the request with an internal error (HTTP 500) after the grammar rejects a token.
        raise TTUnsupportedRequestError(
            "allowed_token_ids cannot be combined with structured outputs (response_format, "
            "structured_outputs) on the TT backend: the grammar may allow none of the listed "
            "tokens. Remove allowed_token_ids, or the structured output constraint.",
            parameter="allowed_token_ids", value=params.allowed_token_ids,
        )
    if params.prompt_logprobs is not None and rules is not None and not rules.prompt_logprobs:
        raise TTUnsupportedRequestError(
            f"prompt_logprobs is not supported by {rules.arch}: the model returns only the last "
            "prompt position's logits (it does not declare supports_prompt_logprobs). Remove "
            "prompt_logprobs from the request, or serve a model that declares it.",
            parameter="prompt_logprobs", value=params.prompt_logprobs,
        )
