"""Every figure a reader opens is at most 1250 px wide: the image outputs of the committed notebooks and the PNGs of
the committed results. Wider ones are scaled down by the browser or the Lab, and their labels become unreadable.

The width is read from the PNG header (the IHDR chunk), so the test needs no image library."""
import base64
import json
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_WIDTH = 1250
# Known exceptions, owned elsewhere, until they are redrawn (each must still be too wide: see the last test).
# benchmarks/results/scaling.png is drawn by the benchmarks (2310 px).
KNOWN_WIDE = {
    "benchmarks/results/scaling.png",
}


def png_width(data: bytes) -> int:
    """The width in the PNG's IHDR chunk, which the format puts first, right after the 8-byte signature."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">I", data[16:20])[0]


def figures():
    """(where, PNG bytes) for every image/png output of every notebook, and every PNG under the results folders;
    `where` is the file's path from the repository root (a notebook's figures all share it)."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            for output in cell.get("outputs", []):
                png = output.get("data", {}).get("image/png")
                if png:
                    yield path.relative_to(ROOT).as_posix(), base64.b64decode(png)
    for folder in ("experiments/results", "benchmarks/results"):
        for path in sorted((ROOT / folder).rglob("*.png")):
            yield path.relative_to(ROOT).as_posix(), path.read_bytes()


FIGURES = list(figures())


def test_png_width_reads_the_header():
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", 1251, 7)
    assert png_width(header) == 1251
    with pytest.raises(AssertionError):
        png_width(b"GIF89a" + bytes(20))


def test_every_figure_is_at_most_1250_px_wide():
    assert len({where for where, _ in FIGURES}) > 10          # the notebooks and the results were found
    too_wide = sorted({f"{where}: {png_width(data)} px" for where, data in FIGURES
                       if png_width(data) > MAX_WIDTH and where not in KNOWN_WIDE})
    assert not too_wide, f"figures wider than {MAX_WIDTH} px (smaller figsize or dpi): {too_wide}"


@pytest.mark.parametrize("where", sorted(KNOWN_WIDE))
def test_known_exceptions_are_still_too_wide(where):
    """An exception that has been fixed leaves the list, so that it cannot grow wide again unnoticed."""
    widths = [png_width(data) for w, data in FIGURES if w == where]
    assert widths, f"{where} has no figure any more: drop it from KNOWN_WIDE"
    assert max(widths) > MAX_WIDTH, f"{where} is now within {MAX_WIDTH} px: drop it from KNOWN_WIDE"
