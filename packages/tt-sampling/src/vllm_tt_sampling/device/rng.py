"""Counter-based random draws: the uniform for a row depends only on (seed, position).

A TT device keeps no per-request RNG stream that survives slot moves or preemption, so a seeded
draw must be recomputable from what every step knows. Draw ``n`` of a SplitMix64 generator is a
pure function of (seed, n); using the absolute position as ``n`` makes a seeded request give the
same tokens whatever its batch neighbours, slot or preemption history.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15


def splitmix64(seed: int, counter: int) -> int:
    """Output number ``counter`` of the SplitMix64 sequence started at ``seed`` (both taken
    modulo 2**64, so negative seeds are fine)."""
    z = (seed + (counter + 1) * _GOLDEN_GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def seeded_uniform(seed: int, position: int) -> float:
    """Uniform in [0, 1) with 53 random bits, a pure function of (seed, position)."""
    return (splitmix64(seed, position) >> 11) * (1.0 / (1 << 53))
