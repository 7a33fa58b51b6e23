"""``DeviceSlots``: the decode inputs a TT device keeps per slot between decode steps.

With device sampling, a traced tt-metal decode writes each sampled token back into its own
input buffer and advances the position, so the runner may submit step k+1 before it has seen
step k's token: the device, not the host, is authoritative for continuing slots. Host inputs are
taken for slots prefilled since the last decode, after a host-sampled step, and on a batch reset
for slots whose device position is neither the host's nor one ahead of it (contract §3.3a).
"""

from __future__ import annotations

import torch

from vllm_tt_host.models.frame.shapes import HostModelInputError


class DeviceSlots:
    def __init__(self, rows: int) -> None:
        self.tokens = torch.zeros(rows, dtype=torch.int64)
        self.positions = torch.full((rows,), -1, dtype=torch.int64)
        """Position of the token each slot feeds next (-1: none)."""
        self.valid = torch.zeros(rows, dtype=torch.bool)
        """The slot's token and position were produced on the device."""
        self.fresh = torch.zeros(rows, dtype=torch.bool)
        """Prefilled since the last decode: the host has the slot's token."""

    def prefilled(self, slots: list[int]) -> None:
        index = torch.tensor(slots, dtype=torch.long)
        self.fresh[index] = True
        self.valid[index] = False

    def host_sampled(self) -> None:
        """A decode returned logits: the host samples, so it supplies every input next time."""
        self.valid[:] = False
        self.fresh[:] = False

    def inputs(self, tokens: torch.Tensor, positions: torch.Tensor, *, reset: bool,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens and positions a device-sampled decode actually runs with."""
        use = self.device_rows(positions, reset=reset)
        return torch.where(use, self.tokens, tokens.long()), torch.where(use, self.positions, positions.long())

    def device_rows(self, positions: torch.Tensor, *, reset: bool) -> torch.Tensor:
        """bool ``[rows]``: the slots that continue from device state at host ``positions``.

        Without ``reset`` the layout is unchanged, so a continuing slot must sit where the
        device left it; anything else means the runner changed the batch without saying so."""
        live = positions >= 0
        continuing = live & self.valid & ~self.fresh
        aligned = (self.positions == positions) | (self.positions == positions + 1)
        if not reset and bool((continuing & ~aligned).any()):
            slot = int(torch.nonzero(continuing & ~aligned)[0, 0])
            raise HostModelInputError(
                f"decode slot {slot}: device position {int(self.positions[slot])}, host position "
                f"{int(positions[slot])}, and no reset_batch; send reset_batch=True when the "
                "decode layout changes"
            )
        return continuing & aligned

    def sampled(self, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """Device sampling wrote ``tokens`` back for the live rows at ``positions``."""
        live = positions >= 0
        self.tokens[live] = tokens.long()[live]
        self.positions[live] = positions.long()[live] + 1
        self.valid |= live
        self.fresh &= ~live
