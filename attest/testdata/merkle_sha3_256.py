#!/usr/bin/env python3
"""Independent reference for rackwarden's file digest `merkle_sha3_256` (hashlib only).

    chunks: 1 MiB (1,048,576 bytes), the last may be shorter; an empty file is one empty chunk
    leaf:   SHA3-256(0x00 || chunk)
    node:   SHA3-256(0x01 || left || right), RFC 6962 shape: for n > 1 leaves split at
            k = the largest power of two smaller than n
    file:   SHA3-256(b"rackwarden/merkle-sha3-256/v1" || 0x00 || u64_le(size) || root)

Usage: merkle_sha3_256.py FILE...      prints "<hex>  <size>  <file>"
       merkle_sha3_256.py --vectors    prints the test vectors as JSON
"""
import hashlib, json, struct, sys

CHUNK = 1 << 20
DOMAIN = b"rackwarden/merkle-sha3-256/v1"


def h(data):
    return hashlib.sha3_256(data).digest()


def root(leaves):
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return h(b"\x01" + root(leaves[:k]) + root(leaves[k:]))


def digest_bytes(data):
    leaves = [h(b"\x00" + data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)] or [h(b"\x00")]
    return h(DOMAIN + b"\x00" + struct.pack("<Q", len(data)) + root(leaves)).hex()


def digest_file(path):
    """Streams the file one chunk at a time (memory: one chunk plus 32 bytes per chunk)."""
    leaves, size = [], 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            size += len(chunk)
            leaves.append(h(b"\x00" + chunk))
    return h(DOMAIN + b"\x00" + struct.pack("<Q", size) + root(leaves or [h(b"\x00")])).hex(), size


def pattern(n):
    """The vector content: byte i is i mod 251."""
    return bytes(i % 251 for i in range(n))


VECTORS = {"empty": 0, "one_byte": 1, "one_mib": CHUNK, "one_mib_plus_1": CHUNK + 1, "three_mib_plus_5": 3 * CHUNK + 5}

if __name__ == "__main__":
    if sys.argv[1:] == ["--vectors"]:
        print(json.dumps({name: {"size": n, "content": "byte i = i mod 251", "merkle_sha3_256": digest_bytes(pattern(n))}
                          for name, n in VECTORS.items()}, indent=2))
    else:
        for f in sys.argv[1:]:
            d, size = digest_file(f)
            print(f"{d}  {size}  {f}")
