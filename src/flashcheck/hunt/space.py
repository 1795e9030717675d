"""The hunted input space as a Hypothesis strategy: where attention kernels break.

Every feature is plain in about two thirds of the draws (so that one can show alone, not hidden under the others) and
its lists start with the plain value, so that Hypothesis's shrinker, which moves each choice towards the first
branch and element (and integers towards 0), leaves a finding with only the values its failure needs.
Lengths: around multiples of the tile sizes kernels use (64, 96, 128, 176, 192, 256, 320, 448, each -1, +0, +1, and
L % 128 == 64: up to 512), drawn as 64 hi + r (r from RESIDUES) so that the shrinker keeps the residue a failure needs
while it lowers hi (a bug at 256 + 1 shrinks to 64 + 1, one at L % 128 == 64 from 192 to 64; as base + offset over
the tile list, 176 + 16 = 192 was a local minimum, and with one sorted list of lengths the shrinker moves one index,
and the lengths it tries in between need not trigger), or any length up to 319, drawn as 64 hi + lo (lo < 64) for the
same reason (a plain integer's shrinker stopped at 129, 192 or 257); Lq and Lk drawn apart (Lq != Lk, causal with
Lq > Lk). Head dims include non-powers of two; K/V heads divide Q heads (GQA, MQA at Hkv = 1). Masks: key padding,
fully masked rows, a shift of every visible score (down to log-sum-exps below -88.7, the exp underflow of fp32); sinks
up to 100; softmax scales up to 1e4 times 1/sqrt(D) (scores of 1e4), and in a quarter of the draws none (scale=None: the
target's own default, which a kernel that pads the head dim may derive from the padded dim); magnitudes up to where
fp16 overflows, and for FP8 inputs up to a quarter of the format's max (112 for e4m3, 14336 for e5m2: the draws
past 4 sigma saturate at 448 or 57344, as FP8 casts do)."""

from __future__ import annotations

from flashcheck.hunt.case import FP8, HuntCase, max_magnitude
from flashcheck.hunt.target import Target

TILES = (64, 96, 128, 176, 192, 256)
# a tile length is 64 HI + RESIDUE, each drawn (and shrunk) on its own: a failure at 256 + 1 shrinks hi towards 0
# while it keeps its residue, so it reaches 64 + 1, the smallest length with the same residue
RESIDUES = (1, 2, 0, -1, 3, 16, 63, 64, 32, 31, 33, 48, 47, 49)  # 96 = 64 + 32, 176 = 128 + 48, each +-1
LENGTHS = tuple(sorted({max(1, 64 * hi + r) for hi in range(8) for r in RESIDUES}))
HEAD_DIMS = (16, 1, 8, 24, 32, 40, 48, 64, 72, 80, 96, 112, 128, 160, 192, 256)
HEADS = (1, 2, 4, 8)
PAD_FRACTIONS = (0.0, 0.25, 0.5, 1.0)
DEAD_ROWS = (0, 1, 3, 64)
SHIFTS = (0.0, -30.0, -60.0, -88.0, -90.0, -100.0, -104.0, -120.0, -200.0, -1000.0, 30.0)
SCALES = (1.0, 0.01, 0.1, 3.0, 10.0, 30.0, 100.0, 1e3, 1e4)
MAGNITUDES = (1.0, 4.0, 16.0, 64.0, 256.0, 1e3, 4096.0)
SINKS = (None, 0.0, 1.0, 5.0, 10.0, 30.0, 50.0, 60.0, 88.0, 90.0, 100.0)
MAX_WORK = 2**21  # B * H * Lq * Lk * D of one case: an FP64 reference with backward in about 0.1 s


def cases(target: Target, *, backward: bool = True):
    """A strategy of HuntCase for `target`: only the dtypes, masks, sinks, K/V head counts and backward it
    takes (a target without masks gets neither masks nor shifts nor emulated sinks)."""
    from hypothesis import assume
    from hypothesis import strategies as st

    length = lengths()

    def plain_or(plain, values):  # two thirds of the draws keep a feature plain, so that one can show alone
        return st.one_of(st.just(plain), st.just(plain), st.sampled_from(values))

    # every strategy built once here, not on each draw (Hypothesis works out each new strategy's properties: a
    # third of a hunt's time went to building them); the same choices, so the same cases from the same seed
    dtypes, head_counts, batches = st.sampled_from(target.dtypes), st.sampled_from(HEADS), st.sampled_from((1, 2))
    ratios = {h: plain_or(1, [r for r in (1, 2, 4, 8) if h % r == 0] if target.gqa else [1]) for h in HEADS}
    dims = st.sampled_from([d for d in HEAD_DIMS if not target.pow2_head_dim or d & (d - 1) == 0])  # FA3 FP8: 2^n
    pads, deads, shifts, sinks = (plain_or(p, v) for p, v in ((0.0, PAD_FRACTIONS), (0, DEAD_ROWS), (0.0, SHIFTS),
                                                              (None, SINKS)))  # fmt: skip
    sizes = {dt: [m for m in MAGNITUDES if m <= max_magnitude(dt)] for dt in target.dtypes}
    fp8_sizes = {dt: st.one_of(st.just(1.0), st.just(1.0), st.just(max_magnitude(dt)), st.sampled_from(sizes[dt]))
                 for dt in target.dtypes if dt in FP8}  # fmt: skip
    magnitudes = {dt: fp8_sizes[dt] if dt in fp8_sizes else plain_or(1.0, sizes[dt]) for dt in target.dtypes}
    scales = st.one_of(st.just(1.0), st.just(1.0), st.just(None), st.sampled_from(SCALES))  # None: the default
    seeds, booleans = st.integers(0, 2**16), st.booleans()

    @st.composite
    def draw_case(draw) -> HuntCase:
        dtype = draw(dtypes)
        heads = draw(head_counts)
        kv_heads = heads // draw(ratios[heads])
        lq, lk, d = draw(length), draw(length), draw(dims)
        batch = draw(batches)
        assume(batch * heads * lq * lk * d <= MAX_WORK)
        causal = draw(booleans)
        masks = target.masks
        pad = round(draw(pads) * lk) if masks else 0
        dead = min(lq, draw(deads)) if masks else 0
        shift = draw(shifts) if masks else 0.0
        sink = draw(sinks) if masks or target.native_sink else None
        magnitude = draw(magnitudes[dtype])  # FP8: its near-overflow draw, the largest allowed, a quarter of draws
        scale = draw(scales)
        seed = draw(seeds)
        back = draw(booleans) if backward and target.backward else False
        fields = dict(dtype=dtype, batch=batch, heads=heads, kv_heads=kv_heads, lq=lq, lk=lk, head_dim=d)
        fields |= dict(causal=causal, pad=pad, dead=dead, shift=shift, scale=scale, magnitude=magnitude)
        return HuntCase(**fields, sink=sink, seed=seed, backward=back)

    return draw_case()


def lengths():
    """A strategy of sequence lengths: two thirds 64 hi + a tile residue (up to 512), one third any up to 319."""
    from hypothesis import strategies as st

    tile = st.builds(lambda hi, r: max(1, 64 * hi + r), st.integers(0, 7), st.sampled_from(RESIDUES))
    free = st.builds(lambda hi, lo: max(1, 64 * hi + lo), st.integers(0, 4), st.integers(0, 63))
    return st.one_of(tile, tile, free)
