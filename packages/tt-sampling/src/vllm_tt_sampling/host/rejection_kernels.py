"""Host bodies of the four Triton kernels inside vLLM's ``RejectionSampler``.

vLLM's rejection sampler (acceptance rules, recovered and bonus tokens, logprobs, its
``SpecDecodeMetadata``) is what verifies drafts on the TT host sampling path. Its per-request
loops are Triton kernels, which need a GPU or Triton's CPU backend; vLLM's own CPU platform
replaces them with C++ from ``vllm._C``, which a TT install does not build. vLLM's override
wrapper for exactly this (``vllm.triton_utils.dispatcher``: "non-CUDA platforms can replace
Triton kernels") takes these torch bodies instead (see ``register``). Each does per request what the
kernel of the same name does per program id; the algorithm and everything around it stay vLLM's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_MODULE = "vllm.v1.sample.rejection_sampler"
_registered = False


def _spans(cu_num_draft_tokens: torch.Tensor) -> list[tuple[int, int]]:
    ends = cu_num_draft_tokens.tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def rejection_greedy_sample(
    output_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor, draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor, bonus_token_ids: torch.Tensor, is_greedy: torch.Tensor | None,
    max_spec_len: int, uniform_probs: torch.Tensor | None = None,
    synthetic_conditional_rates: torch.Tensor | None = None, SYNTHETIC_MODE: bool = False,  # noqa: N803
) -> None:
    """Greedy rows: keep drafts while they equal the target argmax, then the argmax; the bonus
    token when every draft was kept."""
    if SYNTHETIC_MODE:
        raise NotImplementedError("synthetic acceptance rates are not supported on the TT host sampler")
    drafts, argmax, bonus = draft_token_ids.tolist(), target_argmax.tolist(), bonus_token_ids.reshape(-1).tolist()
    greedy = None if is_greedy is None else is_greedy.tolist()
    for req, (start, end) in enumerate(_spans(cu_num_draft_tokens)):
        if greedy is not None and not greedy[req]:
            continue
        rejected = False
        for pos in range(end - start):
            output_token_ids[req, pos] = argmax[start + pos]
            if drafts[start + pos] != argmax[start + pos]:
                rejected = True
                break
        if not rejected:
            output_token_ids[req, end - start] = bonus[req]


def rejection_random_sample(
    output_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor, draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None, target_probs: torch.Tensor, bonus_token_ids: torch.Tensor,
    recovered_token_ids: torch.Tensor, uniform_probs: torch.Tensor, is_greedy: torch.Tensor,
    max_spec_len: int, vocab_size: int, synthetic_conditional_rates: torch.Tensor | None = None,
    NO_DRAFT_PROBS: bool = False, SYNTHETIC_MODE: bool = False,  # noqa: N803
) -> None:
    """Sampled rows: accept draft ``d`` when ``p_target(d) / p_draft(d) >= u`` (``p_draft = 1``
    without draft probabilities, n-gram), else emit the recovered token and stop."""
    if SYNTHETIC_MODE:
        raise NotImplementedError("synthetic acceptance rates are not supported on the TT host sampler")
    drafts, bonus = draft_token_ids.tolist(), bonus_token_ids.reshape(-1).tolist()
    greedy, uniform, recovered = is_greedy.tolist(), uniform_probs.tolist(), recovered_token_ids.tolist()
    for req, (start, end) in enumerate(_spans(cu_num_draft_tokens)):
        if greedy[req]:
            continue
        rejected = False
        for pos in range(end - start):
            index, draft = start + pos, drafts[start + pos]
            accepted = False
            if draft >= 0:
                q = 1.0 if NO_DRAFT_PROBS or draft_probs is None else float(draft_probs[index, draft])
                accepted = q > 0 and float(target_probs[index, draft]) / q >= uniform[index]
            output_token_ids[req, pos] = draft if accepted else recovered[index]
            if not accepted:
                rejected = True
                break
        if not rejected:
            output_token_ids[req, end - start] = bonus[req]


def expand(
    output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor, replace_from: float,
    replace_to: float, MAX_NUM_TOKENS: int | None = None,  # noqa: N803
) -> None:
    """Repeat each request's value over its draft positions (``replace_from`` -> ``replace_to``)."""
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    for req, (start, end) in enumerate(_spans(cu_num_tokens)):
        output[start:end] = values[req]


def sample_recovered_tokens(
    output_token_ids: torch.Tensor, cu_num_draft_tokens: torch.Tensor, draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None, target_probs: torch.Tensor, inv_q: torch.Tensor, vocab_size: int,
    BLOCK_SIZE: int | None = None, NO_DRAFT_PROBS: bool = False, USE_FP64_GUMBEL: bool = False,  # noqa: N803
) -> None:
    """The token drawn from ``max(p_target - p_draft, 0)`` at each draft position (without draft
    probabilities: the target distribution minus the draft token), by the exponential race
    ``argmax(prob / q)`` on the request's noise ``inv_q``."""
    for req, (start, end) in enumerate(_spans(cu_num_draft_tokens)):
        for index in range(start, end):
            if NO_DRAFT_PROBS or draft_probs is None:
                prob = target_probs[index].clone()
                prob[int(draft_token_ids[index])] = 0.0
            else:
                prob = (target_probs[index] - draft_probs[index]).clamp(min=0.0)
            output_token_ids[index] = int((prob.to(inv_q.dtype) * inv_q[req]).argmax())


def register() -> None:
    """Put the bodies above in place of vLLM's Triton kernels, once per process, unless a
    Triton backend can run the kernels themselves.

    vLLM's ``register_kernels`` wraps each body in its ``KernelOverride`` and then rebinds every
    reference to the kernel by scanning all of ``sys.modules``; in an engine process that scan
    fails on a module whose attributes are not plain objects (vLLM 0.33: ``AttributeError:
    '_lib_fn_wrapper' object has no attribute 'get'``). The kernels are referenced only from
    the rejection sampler's module (the kernel and its JIT-warmup launcher), so the same
    wrappers are bound there, which is all that scan would have changed."""
    global _registered
    from vllm.triton_utils import HAS_TRITON

    if _registered or HAS_TRITON:
        return
    import importlib

    from vllm.triton_utils.dispatcher import KernelOverride

    module = importlib.import_module(_MODULE)
    bodies: dict[str, Callable[..., None]] = {
        "rejection_greedy_sample_kernel": rejection_greedy_sample,
        "rejection_random_sample_kernel": rejection_random_sample,
        "expand_kernel": expand,
        "sample_recovered_tokens_kernel": sample_recovered_tokens,
    }
    for name, body in bodies.items():
        original = getattr(module, name)
        wrapper = KernelOverride(original, body)
        for value in list(vars(module).values()):
            held = getattr(value, "__dict__", None)
            if isinstance(held, dict) and held.get("kernel") is original:
                value.kernel = wrapper
                held.pop("_kernel_arg_names", None)
        setattr(module, name, wrapper)
    _registered = True
