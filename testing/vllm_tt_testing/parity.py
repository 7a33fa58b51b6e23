"""Token and logit parity with transformers, for host reference models driven through the TT
contract: the prompts, transformers' greedy continuation with its logits, and the check."""

from __future__ import annotations

from typing import Any, Protocol

import torch


class Generated(Protocol):
    """What a contract-driving test keeps per request."""

    prompt: list[int]
    generated: list[int]
    logits: list[torch.Tensor]


def prompts(seed: int, *lengths: int) -> list[list[int]]:
    """Random prompts of the given lengths over ids 3..999 (clear of the tiny tokenizer's
    special tokens)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in lengths]


def hf_greedy(hf: Any, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy ``steps`` tokens after ``prompt`` (never stopping at eos) and the
    logits each was chosen from."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=steps,
            eos_token_id=None, pad_token_id=2, output_logits=True, return_dict_in_generate=True,
        )
    return out.sequences[0, len(prompt) :].tolist(), [x[0] for x in out.logits]


def assert_matches_hf(hf: Any, seq: Generated, tolerance: float = 1e-4) -> float:
    """Tokens equal and logits close at every generated position; returns the largest logit
    difference."""
    tokens, logits = hf_greedy(hf, seq.prompt, len(seq.generated))
    assert seq.generated == tokens
    for step, (ours, theirs) in enumerate(zip(seq.logits, logits, strict=True)):
        torch.testing.assert_close(ours, theirs, atol=tolerance, rtol=tolerance, msg=f"step {step}")
    return max((float((a - b).abs().max()) for a, b in zip(seq.logits, logits, strict=True)), default=0.0)


def hf_all_logits(hf: Any, prompt: list[int]) -> torch.Tensor:
    """transformers' logits ``[len(prompt), V]`` after every prompt position."""
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0]


def assert_every_position_matches(ours: torch.Tensor, theirs: torch.Tensor, tolerance: float = 1e-4) -> None:
    """Logits ``[T, V]`` close at every position and the same greedy token at each."""
    diff = (ours - theirs).abs().max().item()
    assert diff < tolerance, diff
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def assert_mistake_shows(wrong: torch.Tensor, right: torch.Tensor, theirs: torch.Tensor, mistake: str) -> None:
    """A plausible mistake moves the logits far past the parity tolerance and changes greedy
    tokens, while the same path without it (``right``) stays within it."""
    assert (wrong - theirs).abs().max().item() > 1e-2, mistake
    assert not torch.equal(wrong.argmax(-1), theirs.argmax(-1)), mistake
    assert (right - theirs).abs().max().item() < 1e-4
