"""EXIF as tools write it: one 80x60 JPEG per writer, each tagged with a 35 mm equivalent focal
length of 26 mm, and one whose EXIF cannot be read at all, into
tests/fixtures/images/exif_tools/ (read by tests/it/exif_focal.rs).

    python tests/make_exif_fixtures.py     # needs piexif and Pillow (PyPI), exiftool (Debian's
                                           # libimage-exiftool-perl)

piexif ends the Exif IFD without the next-IFD offset that the TIFF layout asks for; PIL and
exiftool write it whole.
"""

import os
import subprocess

import piexif
from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "images", "exif_tools")
F35 = 26


def plain(path):
    # A gradient, so that the model's estimate differs from the tags' field of view.
    im = Image.new("RGB", (80, 60))
    im.putdata([(x * 3, y * 4, (x + y) % 256) for y in range(60) for x in range(80)])
    im.save(path, quality=90)


def main():
    os.makedirs(OUT, exist_ok=True)
    p = os.path.join(OUT, "piexif.jpg")
    plain(p)
    piexif.insert(piexif.dump({"Exif": {piexif.ExifIFD.FocalLengthIn35mmFilm: F35}}), p)

    p = os.path.join(OUT, "pil.jpg")
    plain(p)
    im = Image.open(p)
    exif = Image.Exif()
    exif.get_ifd(0x8769)[0xA405] = F35
    im.save(p, exif=exif.tobytes(), quality=90)

    p = os.path.join(OUT, "exiftool.jpg")
    plain(p)
    subprocess.run(["exiftool", "-q", "-overwrite_original", f"-FocalLengthIn35mmFormat={F35}", p], check=True)

    # An APP1 "Exif" segment whose TIFF header is not one: the tags cannot be reached.
    p = os.path.join(OUT, "unreadable.jpg")
    plain(p)
    data = open(p, "rb").read()
    payload = b"Exif\0\0" + b"XX\x2a\x00" + b"\0" * 12
    segment = b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload
    with open(p, "wb") as f:
        f.write(data[:2] + segment + data[2:])


if __name__ == "__main__":
    main()
