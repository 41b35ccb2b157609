"""Reading the examples' pictures back: is a title written in a picture's pixels?"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

from _curves import INK, SCALE, text, text_width  # noqa: E402


def has_text(img, s):
    """Whether ``s`` is written in ``img`` (``(h, w, 3)`` uint8) in the examples' 3x5 font: ink exactly where
    the glyphs have it, and nowhere else in the box of the text."""
    canvas = np.full((5 * SCALE, text_width(s), 3), 255, np.uint8)
    text(canvas, 0, 0, s)
    want, ink = np.all(canvas == INK, -1), np.all(np.asarray(img)[..., :3] == INK, -1)
    h, w = want.shape
    y0, x0 = np.argwhere(want)[0]                                  # the text's first ink pixel, row by row
    for y, x in np.argwhere(ink):
        top, left = y - y0, x - x0
        if 0 <= top <= ink.shape[0] - h and 0 <= left <= ink.shape[1] - w and \
                np.array_equal(ink[top:top + h, left:left + w], want):
            return True
    return False

