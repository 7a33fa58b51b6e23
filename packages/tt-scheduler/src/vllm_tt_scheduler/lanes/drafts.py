"""Route the runner's drafts (``take_draft_token_ids``) to the lanes holding their rows.

The runner proposes drafts for the rows of the whole step, every lane's rows in one
``DraftTokenIds``; each lane's scheduler must see only its own requests' drafts, so it validates
(grammar), schedules and later counts the acceptance of exactly the drafts of its rows.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from vllm.v1.outputs import DraftTokenIds


def route_drafts(drafts: DraftTokenIds, lanes: Sequence[Container[str]]) -> list[DraftTokenIds | None]:
    """``drafts`` split by the lane whose requests (``lanes[i]``: the ids lane i holds) include
    each row, order kept; None for a lane with no drafts. Ids no lane holds (a request finished
    or aborted since the step ran) are dropped, as vLLM's scheduler skips them."""
    ids: list[list[str]] = [[] for _ in lanes]
    tokens: list[list[list[int]]] = [[] for _ in lanes]
    for req_id, draft in zip(drafts.req_ids, drafts.draft_token_ids, strict=True):
        for index, held in enumerate(lanes):
            if req_id in held:
                ids[index].append(req_id)
                tokens[index].append(draft)
                break
    return [DraftTokenIds(lane_ids, lane_tokens) if lane_ids else None
            for lane_ids, lane_tokens in zip(ids, tokens, strict=True)]
