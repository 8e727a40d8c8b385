#!/usr/bin/env python3
"""Independent reference for rackwarden's wipe stream v2 (hashlib + the openssl CLI only).

    key          = SHA3-256(b"rackwarden/wipe-stream/v2" || 0x00 || nonce[32] || device)[0:16]
    seed(s)      = AES-128-ECB(key, s as a 16-byte big-endian integer), s = offset // 65536
    k0, k1       = seed[0:4], seed[4:8] as little-endian u32
    word(s, j)   = lowbias32(j ^ k0) ^ k1,  j = (offset % 65536) // 4
    lowbias32(x) = x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16
    bytes        = each word little-endian

Usage: wipe_stream_v2.py --vectors     prints the test vectors as JSON (wipe_stream_v2.json)
"""
import hashlib, json, struct, subprocess, sys

DOMAIN = b"rackwarden/wipe-stream/v2"
SEGMENT = 1 << 16
M = 0xFFFFFFFF


def key(nonce, device):
    return hashlib.sha3_256(DOMAIN + b"\x00" + nonce + device.encode()).digest()[:16]


def aes_ecb(k, blocks):
    out = subprocess.run(
        ["openssl", "enc", "-aes-128-ecb", "-nopad", "-nosalt", "-K", k.hex()],
        input=blocks, capture_output=True, check=True).stdout
    assert len(out) == len(blocks)
    return out


def lowbias32(x):
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M
    x ^= x >> 15
    x = (x * 0x846CA68B) & M
    x ^= x >> 16
    return x


def stream(nonce, device, offset, length):
    assert offset % 4 == 0 and length % 4 == 0
    k = key(nonce, device)
    first, last = offset // SEGMENT, (offset + length - 1) // SEGMENT
    seeds = aes_ecb(k, b"".join(s.to_bytes(16, "big") for s in range(first, last + 1)))
    out = bytearray()
    for o in range(offset, offset + length, 4):
        s = o // SEGMENT
        seed = seeds[(s - first) * 16:(s - first + 1) * 16]
        k0, k1 = struct.unpack("<II", seed[:8])
        j = (o % SEGMENT) // 4
        out += struct.pack("<I", lowbias32(j ^ k0) ^ k1)
    return bytes(out)


def vectors():
    cases = [
        (bytes(32), "host-ram", 0, 32),
        (bytes(32), "host-ram", 65536 - 16, 32),      # across a segment boundary
        (bytes([0x42]) * 32, "gpu3", 0, 64),
        (bytes([0x42]) * 32, "gpu3", 5 * (1 << 30) + 4096, 48),  # segment 81,920 + 4 KiB
        (bytes(range(32)), "gpu0", (1 << 40) - 32, 32),          # the last bytes of 1 TiB
    ]
    out = []
    for nonce, device, offset, length in cases:
        out.append({
            "nonce": nonce.hex(), "device": device, "offset": offset,
            "key": key(nonce, device).hex(),
            "bytes": stream(nonce, device, offset, length).hex(),
        })
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--vectors"]:
        print(json.dumps(vectors(), indent=1))
    else:
        sys.exit(__doc__)
