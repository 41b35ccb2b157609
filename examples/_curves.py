"""Line charts drawn with numpy alone (written with imageio): an example's loss and PSNR curves as a PNG.

    write_curves("out/curves.png", [Panel("LOSS", steps, losses, log=True), Panel("PSNR DB", at, psnrs)])

Each panel is a chart of its own, stacked top to bottom: its title (``LOG SCALE`` added for a log y axis),
a light grid, the curve (and a dot per point when there are few), the y value of every grid line at the left
and the step of every grid line below, in a 3x5 pixel font.
"""
from dataclasses import dataclass

import numpy as np

WHITE, GRID, INK = (255, 255, 255), (225, 225, 225), (40, 40, 40)
COLOURS = ((31, 119, 180), (214, 39, 40), (44, 160, 44))
SCALE = 2                                          # pixels per font pixel
_GLYPHS = {                                        # 3x5 pixels, row by row
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
    "+": "000010111010000", " ": "000000000000000", "(": "010100100100010", ")": "010001001001010",
    ":": "000010000010000", "/": "001001010100100", "=": "000111000111000", ",": "000000000010100",
    "%": "101001010100101", "_": "000000000000111", "<": "001010100010001", ">": "100010001010100",
    "'": "010010000000000", "#": "101111101111101", "A": "010101111101101", "B": "110101110101110",
    "C": "011100100100011", "D": "110101101101110", "E": "111100111100111", "F": "111100110100100",
    "G": "011100101101011", "H": "101101111101101", "I": "111010010010111", "J": "001001001101010",
    "K": "101101110101101", "L": "100100100100111", "M": "101111111101101", "N": "110101101101101",
    "O": "010101101101010", "P": "110101110100100", "Q": "010101101110011", "R": "110101110101101",
    "S": "011100010001110", "T": "111010010010010", "U": "101101101101111", "V": "101101101101010",
    "W": "101101111111101", "X": "101101010101101", "Y": "101101010010010", "Z": "111001010100111",
}


@dataclass
class Panel:
    """A curve ``ys`` over ``xs``; ``log``: a logarithmic y axis (values must be positive)."""
    title: str
    xs: np.ndarray
    ys: np.ndarray
    log: bool = False


def text(img, x, y, s):
    """Write ``s`` (letters in upper case, digits, ``.-+()/:=,%_<>'#``) with its top-left corner at pixel ``(x, y)``."""
    for i, ch in enumerate(s.upper()):
        bits = np.array([int(b) for b in _GLYPHS.get(ch, _GLYPHS[" "])], bool).reshape(5, 3)
        glyph = np.kron(bits, np.ones((SCALE, SCALE), bool))
        x0 = x + i * 4 * SCALE
        h, w = glyph.shape
        region = img[y:y + h, x0:x0 + w]
        region[glyph[:region.shape[0], :region.shape[1]]] = INK


def _line(img, x0, y0, x1, y1, colour):
    n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    xs = np.rint(np.linspace(x0, x1, n)).astype(int)
    ys = np.rint(np.linspace(y0, y1, n)).astype(int)
    for dx, dy in ((0, 0), (1, 0), (0, 1)):       # two pixels thick
        img[np.clip(ys + dy, 0, img.shape[0] - 1), np.clip(xs + dx, 0, img.shape[1] - 1)] = colour


def _label(v: float) -> str:
    return f"{v:.3g}".upper()


def draw_panel(panel: Panel, width: int, height: int, colour) -> np.ndarray:
    """One chart, ``(height, width, 3)`` uint8."""
    img = np.full((height, width, 3), WHITE, np.uint8)
    left, right, top, bottom = 9 * 4 * SCALE + 8, 12, 8 * SCALE + 6, 7 * SCALE + 6
    w, h = width - left - right, height - top - bottom
    xs, ys = np.asarray(panel.xs, np.float64), np.asarray(panel.ys, np.float64)
    keep = np.isfinite(ys) & ((ys > 0) if panel.log else True)
    xs, ys = xs[keep], ys[keep]
    text(img, left, 3, axis_title(panel))
    if len(xs) == 0:
        return img
    vs = np.log10(ys) if panel.log else ys
    x_lo, x_hi = float(xs.min()), float(xs.max())
    v_lo, v_hi = float(vs.min()), float(vs.max())
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    if v_hi == v_lo:
        v_lo, v_hi = v_lo - 0.5, v_hi + 0.5
    for k in range(5):                                            # grid
        img[top + round(k * (h - 1) / 4), left:left + w] = GRID
        img[top:top + h, left + round(k * (w - 1) / 4)] = GRID
    px = left + (xs - x_lo) / (x_hi - x_lo) * (w - 1)
    py = top + (v_hi - vs) / (v_hi - v_lo) * (h - 1)
    for k in range(len(px) - 1):
        _line(img, px[k], py[k], px[k + 1], py[k + 1], colour)
    if len(px) <= 50:                                             # few points: mark each
        for x, y in zip(np.rint(px).astype(int), np.rint(py).astype(int)):
            img[max(y - 2, 0):y + 3, max(x - 2, 0):x + 3] = colour
    unlog = (lambda v: 10 ** v) if panel.log else (lambda v: v)
    text(img, 4, top, _label(unlog(v_hi)))
    text(img, 4, top + h - 5 * SCALE, _label(unlog(v_lo)))
    text(img, left, top + h + 4, f"{x_lo:.0f}")
    hi = f"{x_hi:.0f} STEPS"
    text(img, left + w - len(hi) * 4 * SCALE, top + h + 4, hi)
    _inner_ticks(img, left, top, w, h, (x_lo, x_hi), (v_lo, v_hi), unlog)
    return img


def axis_title(panel: Panel) -> str:
    """The panel's title, saying ``LOG SCALE`` when its y axis is logarithmic and the title does not say so."""
    return panel.title if not panel.log or "LOG" in panel.title.upper() else f"{panel.title} (LOG SCALE)"


def _inner_ticks(img, left, top, w, h, x_range, v_range, unlog):
    """The values at the three inner grid lines of each axis (the ends are labelled by ``draw_panel``)."""
    (x_lo, x_hi), (v_lo, v_hi) = x_range, v_range
    for k in (1, 2, 3):
        y = top + round(k * (h - 1) / 4)
        text(img, 4, y - 5 * SCALE // 2, _label(unlog(v_hi - k * (v_hi - v_lo) / 4)))
        s = f"{x_lo + k * (x_hi - x_lo) / 4:.0f}"
        text(img, left + round(k * (w - 1) / 4) - text_width(s) // 2, top + h + 4, s)


def text_width(s: str) -> int:
    """The width in pixels of ``text(img, x, y, s)``."""
    return len(s) * 4 * SCALE


def titled(img: np.ndarray, title: str) -> np.ndarray:
    """``img`` (``(h, w, 3)`` uint8) with a white band above it holding ``title``, centred."""
    band = np.full((7 * SCALE + 6, img.shape[1], 3), WHITE, np.uint8)
    text(band, max((img.shape[1] - text_width(title)) // 2, 2), 3 + SCALE, title)
    return np.concatenate([band, img], axis=0)


def write_curves(path: str, panels, width: int = 640, panel_height: int = 220):
    """The panels stacked into one PNG at ``path``."""
    import imageio.v3 as iio
    images = [draw_panel(p, width, panel_height, COLOURS[i % len(COLOURS)]) for i, p in enumerate(panels)]
    iio.imwrite(path, np.concatenate(images, axis=0))


@dataclass
class Series:
    """One labelled curve of a chart that holds several: ``ys`` over ``xs``."""
    label: str
    xs: np.ndarray
    ys: np.ndarray


def draw_series(title: str, series, width: int = 640, height: int = 300, log: bool = False,
                x_label: str = "STEPS") -> np.ndarray:
    """Several labelled curves on common axes in one chart, ``(height + legend, width, 3)`` uint8: ``COLOURS[i]``
    for ``series[i]``, the y range at the left, the x range and ``x_label`` below, and under them a legend (a
    swatch and the label of each series, a line each); ``log``: a logarithmic y axis (say so in ``title``; values
    <= 0 are left out)."""
    img = np.full((height + len(series) * 7 * SCALE + 4, width, 3), WHITE, np.uint8)
    left, right, top, bottom = 9 * 4 * SCALE + 8, 12, 8 * SCALE + 6, 7 * SCALE + 6
    w, h = width - left - right, height - top - bottom
    text(img, left, 3, title)
    kept = []
    for s in series:
        xs, ys = np.asarray(s.xs, np.float64), np.asarray(s.ys, np.float64)
        keep = np.isfinite(ys) & ((ys > 0) if log else True)
        kept.append((xs[keep], np.log10(ys[keep]) if log else ys[keep]))
    xs_all = np.concatenate([x for x, _ in kept] + [np.zeros(0)])
    if len(xs_all) == 0:
        return img[:height]
    vs_all = np.concatenate([v for _, v in kept])
    x_lo, x_hi, v_lo, v_hi = xs_all.min(), xs_all.max(), vs_all.min(), vs_all.max()
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    if v_hi == v_lo:
        v_lo, v_hi = v_lo - 0.5, v_hi + 0.5
    for k in range(5):                                            # grid
        img[top + round(k * (h - 1) / 4), left:left + w] = GRID
        img[top:top + h, left + round(k * (w - 1) / 4)] = GRID
    for i, (xs, vs) in enumerate(kept):
        colour = COLOURS[i % len(COLOURS)]
        px = left + (xs - x_lo) / (x_hi - x_lo) * (w - 1)
        py = top + (v_hi - vs) / (v_hi - v_lo) * (h - 1)
        for k in range(len(px) - 1):
            _line(img, px[k], py[k], px[k + 1], py[k + 1], colour)
        if len(px) == 1:
            x, y = int(round(px[0])), int(round(py[0]))
            img[max(y - 2, 0):y + 3, max(x - 2, 0):x + 3] = colour
    unlog = (lambda v: 10 ** v) if log else (lambda v: v)
    text(img, 4, top, _label(unlog(v_hi)))
    text(img, 4, top + h - 5 * SCALE, _label(unlog(v_lo)))
    text(img, left, top + h + 4, f"{x_lo:.0f}")
    hi = f"{x_hi:.0f} {x_label}"
    text(img, left + w - text_width(hi), top + h + 4, hi)
    for i, s in enumerate(series):                                # the legend, below the chart
        y = height + i * 7 * SCALE
        img[y + 2 * SCALE - 1:y + 3 * SCALE + 1, left:left + 5 * SCALE] = COLOURS[i % len(COLOURS)]
        text(img, left + 7 * SCALE, y, s.label)
    return img
