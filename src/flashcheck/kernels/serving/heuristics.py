"""The tile and split choices of the serving kernels, as functions of the launch (not of the numbers).

These decide which keys share a tile and which a split, and so whether two launches of the same request
round alike. Each follows its source, read at one commit (learned from, not copied):
- FA3 (vllm-project/flash-attention at 617264c1, hopper/tile_size.h `tile_size_fwd_sm90`, hopper/heuristics.h
  `use_one_mma_wg` and `num_splits_heuristic`, hopper/flash_api.cpp `get_num_splits`). With two-level FP8
  accumulation compiled in (the default), FP8 decode (one MMA warpgroup: seqlen_q * h / h_k <= 64 at head dim
  64 or 128) takes kBlockN 96 at head dim > 96 (128 at <= 96), FP8 prefill kBlockN 192 at head dim 128;
  bf16 takes 176 / 160 (non-causal) or 128 (causal) for both, since the one-warpgroup change keeps kBlockN 128
  under a causal mask.
- FlashInfer's batch decode (flashinfer-ai/flashinfer at 00b1eec4, include/flashinfer/attention/scheduler.cuh
  `PartitionPagedKVCacheBinarySearchMinNumPagePerBatch` and its caller): with fewer than max_grid CTAs the
  KV is cut into chunks of the fewest pages (at least 128 / page_size) that keep the chunks of the *whole
  batch* within the grid, so a request's chunking depends on its neighbours; `fixed_split_size` (flashinfer#1675)
  fixes the chunk instead.
"""

from __future__ import annotations

import math

H100_SMS = 132


def fa3_use_one_mma_wg(seqlen_q: int, heads: int, kv_heads: int, head_dim: int, *, local: bool = False) -> bool:
    """heuristics.h use_one_mma_wg on sm90: head dim 64 or 128, not local, seqlen_q * h / h_k <= 64."""
    return head_dim in (64, 128) and not local and seqlen_q * (heads // kv_heads) <= 64


def fa3_tile_size(head_dim: int, *, fp8: bool, causal: bool, one_mma_wg: bool) -> tuple[int, int]:
    """tile_size_fwd_sm90's (kBlockM, kBlockN) for head_dim_v == head_dim, no paging, softcap or window,
    two-level FP8 accumulation compiled in (FLASHATTENTION_DISABLE_FP8_TWO_LEVEL_ACCUMULATION unset)."""
    if fp8:
        if one_mma_wg:
            return (64, 128) if head_dim <= 96 else (64, 96)
        table = ((64, (192, 128)), (96, (128, 128)), (128, (128, 192)), (192, (128, 96)), (256, (128, 128)))
    else:
        if head_dim <= 64:
            return (64, 192) if one_mma_wg else (192, 128 if causal else 192)
        if head_dim <= 128 and head_dim > 96:
            return (64, 128 if causal else 176) if one_mma_wg else (128, 128 if causal else 160)
        table = ((96, (192, 144)), (192, (128, 96)), (256, (128, 80)))
    for limit, tile in table:
        if head_dim <= limit:
            return tile
    raise ValueError(f"head_dim={head_dim} is not supported by FA3 (at most 256)")


def fa3_num_splits_heuristic(
    total_mblocks: int, num_sms: int, num_n_blocks: int, num_m_blocks: int, size_one_kv_head: int,
    causal_or_local: bool, max_splits: int = 128,
) -> int:  # fmt: skip
    """heuristics.h num_splits_heuristic: the fewest splits within 85% of the best wave efficiency."""
    if total_mblocks >= 0.8 * num_sms:
        size_l2 = 50 * 1024 * 1024
        if size_one_kv_head > size_l2 and num_m_blocks >= num_sms * 2 and not causal_or_local:
            return min((size_one_kv_head + size_l2 - 1) // size_l2, max_splits)
        return 1
    if num_n_blocks <= 4:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)
    eff = []
    for s in range(1, max_splits + 1):
        waves = total_mblocks * s / num_sms
        eff.append(waves / math.ceil(waves))
    best = max(eff)
    return next(s for s in range(1, max_splits + 1) if eff[s - 1] >= 0.85 * best)


def fa3_launch_tile(
    seqlen_q: int, heads: int, kv_heads: int, head_dim: int, *, fp8: bool, causal: bool, paged: bool = True
) -> tuple[int, int]:
    """(kBlockM, kBlockN) of one launch as flash_api.cpp picks it: a single query row drops the causal flag
    unless the KV is paged at head dim 64 < d <= 128 (the paged special case that keeps kBlockN 128), then
    fa3_tile_size with use_one_mma_wg."""
    if seqlen_q == 1 and ((head_dim <= 64 or head_dim > 128) or not paged):
        causal = False
    one = fa3_use_one_mma_wg(seqlen_q, heads, kv_heads, head_dim)
    return fa3_tile_size(head_dim, fp8=fp8, causal=causal, one_mma_wg=one)


def fa3_num_splits(
    batch: int, seqlen_q: int, seqlen_k: int, heads: int, kv_heads: int, head_dim: int, *, fp8: bool,
    causal: bool, num_sms: int = H100_SMS, varlen: bool = False, paged: bool = True,
) -> int:  # fmt: skip
    """flash_api.cpp get_num_splits (num_splits <= 0 asks for it): the tile from fa3_launch_tile, PackGQA rows,
    total_mblocks = batch * h_k * m_blocks (batch taken as 1 for varlen's dynamic split)."""
    block_m, block_n = fa3_launch_tile(seqlen_q, heads, kv_heads, head_dim, fp8=fp8, causal=causal, paged=paged)
    num_n_blocks = -(-seqlen_k // block_n)
    num_m_blocks = -(-(seqlen_q * (heads // kv_heads)) // block_m)
    size_one_kv_head = seqlen_k * 2 * head_dim * (1 if fp8 else 2)
    total = (1 if varlen else batch) * kv_heads * num_m_blocks
    return fa3_num_splits_heuristic(total, num_sms, num_n_blocks, num_m_blocks, size_one_kv_head, causal)


def flashinfer_chunk_pages(
    kv_lens: list[int], kv_heads: int, *, page_size: int = 16, max_grid: int = 2 * H100_SMS,
    fixed_split_pages: int | None = None,
) -> int | None:  # fmt: skip
    """FlashInfer batch decode's KV chunk in pages for a batch with these KV lengths (None: no split).

    `fixed_split_pages` (flashinfer#1675's fixed_split_size) returns itself; otherwise no split when
    batch * kv_heads >= max_grid, else the binary search of PartitionPagedKVCacheBinarySearchMinNumPagePerBatch
    (smallest chunk >= max(128 / page_size, 1) keeping sum ceil(pages / chunk) * kv_heads <= max_grid), and no
    split when that chunk leaves every request whole (not under CUDA graphs). `max_grid`: blocks per SM * SMs."""
    if fixed_split_pages is not None:
        return fixed_split_pages
    if len(kv_lens) * kv_heads >= max_grid:
        return None
    pages = [max(1, -(-n // page_size)) for n in kv_lens]
    low, high = max(128 // page_size, 1), max(pages)
    while low < high:
        mid = (low + high) // 2
        if sum(-(-p // mid) for p in pages) * kv_heads > max_grid:
            low = mid + 1
        else:
            high = mid
    new_batch = sum(-(-p // low) for p in pages)
    return None if new_batch == len(kv_lens) else low


def key_spans(seqlen_k: int, block_n: int, splits: int) -> list[list[tuple[int, int]]]:
    """Per split, its key tiles (start, stop) in the order FA3 visits them: n_block_max - 1 down to n_block_min
    (mainloop_fwd_sm90_tma_gmma_ws.hpp), the n-blocks divided ceil(blocks / splits) per split (block.h)."""
    blocks = -(-seqlen_k // block_n)
    per = -(-blocks // max(1, splits)) if blocks else 0
    out = []
    for s in range(max(1, splits)):
        lo, hi = s * per, min(blocks, (s + 1) * per)
        if lo < hi:
            out.append([(b * block_n, min(seqlen_k, (b + 1) * block_n)) for b in range(hi - 1, lo - 1, -1)])
    return out
