"""What tcnn's ``scripts/common.py`` gives its samples, for running them from ``tests/clients/``:
``read_image`` (float32 (H, W, C) in [0, 1]), ``write_image`` (clamped to [0, 1], 8 bits) and ``ROOT_DIR``."""
import os

import imageio.v3 as iio
import numpy as np

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_image(path):
    img = np.asarray(iio.imread(path))
    img = img[:, :, None] if img.ndim == 2 else img[:, :, :3]
    return np.ascontiguousarray(img.astype(np.float32) / 255.0)


def write_image(path, img):
    iio.imwrite(path, (np.clip(img, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8))
