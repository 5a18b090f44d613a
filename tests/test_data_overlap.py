"""course_lib.data: the verbatim overlap of two texts (issue 19 item 4) and bad input."""
import pytest

from course_lib import data


def test_overlap_mask_by_hand():
    mask = data.overlap_mask("abcdefgh", "xxcdefyy", 3)
    assert mask.tolist() == [False, False, True, True, True, True, False, False]
    assert data.verbatim_overlap("abcdefgh", "xxcdefyy", 3) == 0.5
    assert data.verbatim_overlap("abcdefgh", "abcdefgh", 8) == 1.0
    assert data.verbatim_overlap("abcdefgh", "hgfedcba", 2) == 0.0
    assert data.verbatim_overlap("abc", "abcdef", 5) == 0.0          # shorter than a run


def test_the_topics_halves_overlap_by_about_a_quarter():
    overlap = data.topics_overlap(100)
    assert 0.2 < overlap < 0.3                                       # measured: 24.1%
    assert data.topics_overlap(400) < overlap                        # longer runs match less


def test_overlap_free_windows_by_hand():
    ref = "the quick brown fox jumps"
    texts = ["the quick brown", "a lazy dog", "fox jumps high", "nothing shared"]
    assert data.overlap_free_windows(texts, ref, 2, run=6) == [1, 3]
    assert data.overlap_free_windows(texts, ref, 3, run=6, max_overlap=0.7) == [1, 2, 3]
    with pytest.raises(ValueError, match="only 2 of 4 windows"):
        data.overlap_free_windows(texts, ref, 3, run=6)


@pytest.mark.parametrize("call, match", [
    (lambda: data.overlap_mask("", "abc", 2), "text is empty"),
    (lambda: data.overlap_mask(b"abc", "abc", 2), "text must be a str"),
    (lambda: data.verbatim_overlap("abc", "abc", 0), r"run must be a whole number .* >= 1"),
    (lambda: data.verbatim_overlap("abc", "abc", 2.5), r"run must be a whole number"),
    (lambda: data.overlap_free_windows([], "abc", 1), "window_texts is empty"),
    (lambda: data.overlap_free_windows(["a"], "abc", 0), r"n must be a whole number of windows"),
    (lambda: data.overlap_free_windows(["a"], "abc", 1, max_overlap=5),
     r"max_overlap is a fraction in \[0, 1\] \(0.05 for 5%, not 5\)"),
    (lambda: data.to_tensor(b""), "empty text"),
    (lambda: data.to_tensor([1, 2]), "takes bytes"),
    (lambda: data.heldout_text(0), "max_bytes must be None"),
    (lambda: data.unigram_bits_per_byte(b"abc", b""), "test text is empty"),
    (lambda: data.compressor_bits_per_byte(b""), "text is empty"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
