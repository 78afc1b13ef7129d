"""Image folders (`images("dir")`, `--data images:DIR`): one subfolder per class, as torchvision's ImageFolder.

    load_images(directory, shape, classes, describe) -> (x, y, x_test, y_test)

The class folders' names, sorted by code point, are the class ids 0, 1, ...; the images of a folder, sorted by file
name the same way, follow each other in that order. When DIR holds a folder ``train``, the training samples are
``DIR/train/<class>/*`` and the test samples ``DIR/test/<class>/*`` (when ``DIR/test`` exists; its class folders
take the ids of the training folders of the same names); otherwise DIR's class folders are the training samples and
there is no test set. Entries whose names start with a dot are ignored; any other file that is not ``.png``,
``.jpg`` or ``.jpeg`` (any case) is an error, as is a file outside a class folder or a class folder without images.

Every image must already be W x H, the network input's ``[C, H, W]`` (no resizing); C = 1 takes grayscale images
(8-bit gray, 1-bit, gray with alpha: the alpha dropped, a palette of grays), C = 3 RGB, RGB with alpha (dropped),
palette and grayscale ones (the gray value in all three channels). Pixels become float32 ``byte / 255`` in
``[M, C, H, W]``. PNG images give identical arrays here and in the Java runtime (ImageFolder.java); JPEG decoders
differ, so a JPEG pixel may differ by a few levels between the two. Reading needs Pillow (the ``images`` extra).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from ..errors import DslProgramError

__all__ = ["IMAGE_SUFFIXES", "MAX_ELEMENTS", "load_images"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
MAX_ELEMENTS = 2**31 - 9  # the pixels of one split in one Java array, as the Java runtime holds them

_GRAY = ("L", "1", "LA")
_COLOUR = (*_GRAY, "P", "RGB", "RGBA")


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise DslProgramError(
            "images data needs Pillow to read PNG and JPEG files: pip install 'deepdsl[images]'"
        ) from None
    return Image


def _entries(folder: str) -> list[str]:
    """The names in `folder` not starting with a dot, sorted by code point."""
    try:
        return sorted(n for n in os.listdir(folder) if not n.startswith("."))
    except OSError as err:
        raise DslProgramError(f"cannot list the images folder '{folder}': {err.strerror or err}") from None


def _split(folder: str, known: list[str] | None, classes: int, label: str) -> tuple[list[str], list[int], list[str]]:
    """The image files of one split and their class ids, and the class names (those of `known` for a test split)."""
    names = _entries(folder)
    for n in names:
        if not os.path.isdir(os.path.join(folder, n)):
            raise DslProgramError(f"images folder '{folder}': '{n}' lies outside a class folder (each class is a "
                                  "folder of its images)")  # fmt: skip
    if not names:
        raise DslProgramError(f"images folder '{folder}' holds no class folders (one folder per class, its images "
                              "inside)")  # fmt: skip
    if known is None and len(names) > classes:
        raise DslProgramError(f"images folder '{folder}' has {len(names)} class folders, more than the {classes} "
                              f"classes of the network's {label}")  # fmt: skip
    if known is not None:
        for n in names:
            if n not in known:
                raise DslProgramError(f"images folder '{folder}': the test folder '{n}' is not a class of the "
                                      "training folders")  # fmt: skip
    files: list[str] = []
    ids: list[int] = []
    for n in names:
        sub = os.path.join(folder, n)
        inside = _entries(sub)
        for f in inside:
            if not f.lower().endswith(IMAGE_SUFFIXES) or not os.path.isfile(os.path.join(sub, f)):
                raise DslProgramError(f"images folder '{sub}': '{f}' is not a .png, .jpg or .jpeg file")
        if not inside:
            raise DslProgramError(f"images folder '{folder}': the class folder '{n}' holds no images")
        files += [os.path.join(sub, f) for f in inside]
        ids += [(known or names).index(n)] * len(inside)
    return files, ids, names


def _read(image: Any, path: str, shape: tuple[int, int, int], describe: str) -> np.ndarray:
    c, h, w = shape
    try:
        with image.open(path) as im:
            width, height = im.size
            if (width, height) != (w, h):
                raise DslProgramError(f"image '{path}' is {width}x{height} (width x height), but the network's input "
                                      f"takes {w}x{h}: resize the images beforehand")  # fmt: skip
            mode = im.mode
            if c == 1 and mode == "P" and _gray_palette(im):  # as the Java runtime: a palette of grays is gray
                mode = "L"
            if c == 1 and mode not in _GRAY:
                raise DslProgramError(f"image '{path}' is a colour image ({mode}), but the network's {describe} "
                                      "takes grayscale images")  # fmt: skip
            if mode not in _COLOUR:
                raise DslProgramError(f"image '{path}' has pixels of mode {mode}; images data takes 8-bit "
                                      "grayscale, RGB, RGBA or palette images")  # fmt: skip
            with warnings.catch_warnings():  # Pillow's advice on palette transparency: the alpha is dropped anyway
                warnings.simplefilter("ignore")
                px = np.asarray(im.convert("L" if c == 1 else "RGB"), dtype=np.uint8)
    except DslProgramError:
        raise
    except Exception as err:  # noqa: BLE001  a decoder's failure on a malformed or hostile file, whatever its type
        raise DslProgramError(f"image '{path}' cannot be read as an image: {err}") from None
    px = px.reshape(h, w, c).transpose(2, 0, 1)
    return px


def _gray_palette(im: Any) -> bool:
    pal = im.getpalette() or []
    return all(pal[k] == pal[k + 1] == pal[k + 2] for k in range(0, len(pal) - 2, 3))


def _load_split(image: Any, files: list[str], shape: tuple[int, int, int], describe: str, folder: str) -> np.ndarray:
    per = int(np.prod(shape))
    if len(files) * per > MAX_ELEMENTS:
        raise DslProgramError(f"images folder '{folder}' holds {len(files):,} images of {per:,} values, more than "
                              f"{MAX_ELEMENTS:,} values in all (2^31 - 9, one Java array)")  # fmt: skip
    out = np.empty((len(files), *shape), dtype=np.float32)
    for k, f in enumerate(files):
        out[k] = _read(image, f, shape, describe).astype(np.float32) / np.float32(255)
    return out


def load_images(
    directory: str, shape: tuple[int, ...], classes: int, describe: str, label: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The training (and test) images of `directory` for an input of per-sample `shape` ``(C, H, W)`` (`describe`
    names it) and a label of `classes` classes (`label` names it)."""
    if not os.path.isdir(directory):
        raise DslProgramError(f"images data folder not found: '{directory}'")
    if len(shape) != 3 or shape[0] not in (1, 3):
        raise DslProgramError(f"images data fills an input that takes images [N, C, H, W] with C = 1 (grayscale) "
                              f"or 3 (RGB), not the network's {describe}")  # fmt: skip
    image = _pillow()
    chw = (int(shape[0]), int(shape[1]), int(shape[2]))
    train_dir = os.path.join(directory, "train")
    split = os.path.isdir(train_dir)
    folder = train_dir if split else directory
    files, ids, names = _split(folder, None, classes, label)
    x = _load_split(image, files, chw, describe, folder)
    y = np.array(ids, dtype=np.int64)
    test_dir = os.path.join(directory, "test")
    if not (split and os.path.isdir(test_dir)):
        return x, y, None, None
    tfiles, tids, _ = _split(test_dir, names, classes, label)
    return x, y, _load_split(image, tfiles, chw, describe, test_dir), np.array(tids, dtype=np.int64)
