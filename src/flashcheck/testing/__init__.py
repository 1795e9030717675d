"""For kernel authors: an assertion that catches real attention bugs, the bugs as kernels, and its score.

    from flashcheck.testing import assert_attention_close

    def test_my_kernel():
        assert_attention_close(my_attention, dtype=torch.bfloat16, causal=(False, True), backward=True)

`flashcheck.testing.mutants` holds the bug catalogue, `flashcheck.testing.scores` the catch and
false-failure rates of an acceptance rule."""

from flashcheck.testing.assert_close import assert_attention_close

__all__ = ["assert_attention_close"]
