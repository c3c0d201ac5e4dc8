#!/usr/bin/python3
"""Check gptj checkpoints independently of gptj: every float32 dataset's crc32 attribute must be
zlib's CRC-32 of its row-major bytes as h5py reads them. With --compressed, every dataset must
also be chunked with the shuffle and deflate filters.
usage: ckpt-check.py [--compressed] FILE..."""
import sys
import zlib

import h5py
import numpy as np

args = sys.argv[1:]
compressed = "--compressed" in args
files = [a for a in args if a != "--compressed"]
if not files:
    sys.exit(__doc__)
bad = 0
for path in files:
    n = 0
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            global bad, n
            if not isinstance(obj, h5py.Dataset):
                return
            n += 1
            data = np.ascontiguousarray(obj[...], dtype="<f4")
            want = int(obj.attrs["crc32"])
            got = zlib.crc32(data.tobytes())
            if got != want:
                print(f"{path}: {name}: crc32 attribute {want:08x}, data gives {got:08x}")
                bad += 1
            if compressed and (obj.chunks is None or not obj.shuffle or obj.compression != "gzip"):
                print(f"{path}: {name}: not chunked with shuffle + deflate")
                bad += 1
        f.visititems(visit)
    if n == 0:
        print(f"{path}: no datasets")
        bad += 1
sys.exit(1 if bad else 0)
