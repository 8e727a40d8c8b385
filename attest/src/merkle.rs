//! `merkle_sha3_256`: the file digest of precommitted images.
//!
//! ```text
//! chunks: 1 MiB (1,048,576 bytes), the last may be shorter; an empty file is one empty chunk
//! leaf:   SHA3-256(0x00 || chunk)
//! node:   SHA3-256(0x01 || left || right), RFC 6962 tree shape: for n > 1 leaves split at
//!         k = the largest power of two smaller than n
//! file:   SHA3-256("rackwarden/merkle-sha3-256/v1" || 0x00 || u64_le(file_size) || root)
//! ```
//!
//! An independent reference is `attest/testdata/merkle_sha3_256.py` (hashlib only); the
//! vectors in `attest/testdata/merkle_vectors.json` come from it and are checked here.
//! Chunks are hashed in parallel (each worker `pread`s the chunk it claims, so memory is one
//! chunk buffer per worker); the result never depends on the number of threads.

use std::{
    fs::File,
    os::unix::fs::FileExt,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use crate::{Digest, Sha3_256};

pub const CHUNK: usize = 1 << 20;
pub const DOMAIN: &[u8] = b"rackwarden/merkle-sha3-256/v1";

pub type Hash = [u8; 32];

pub fn leaf(chunk: &[u8]) -> Hash {
    let mut h = Sha3_256::new();
    h.update([0x00]);
    h.update(chunk);
    h.finalize().into()
}

pub fn node(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha3_256::new();
    h.update([0x01]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// RFC 6962 Merkle Tree Hash over leaf hashes (`leaves` must not be empty).
pub fn root(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => leaf(&[]),
        1 => leaves[0],
        n => {
            let k = largest_power_of_two_below(n);
            node(&root(&leaves[..k]), &root(&leaves[k..]))
        }
    }
}

/// The largest power of two strictly smaller than `n` (n >= 2).
fn largest_power_of_two_below(n: usize) -> usize {
    let mut k = 1;
    while k * 2 < n {
        k *= 2;
    }
    k
}

/// The file digest from its size and tree root.
pub fn file_digest(size: u64, root: &Hash) -> Hash {
    let mut h = Sha3_256::new();
    h.update(DOMAIN);
    h.update([0x00]);
    h.update(size.to_le_bytes());
    h.update(root);
    h.finalize().into()
}

/// Number of chunks of a file of `size` bytes (an empty file is one empty chunk).
pub fn chunk_count(size: u64) -> u64 {
    size.div_ceil(CHUNK as u64).max(1)
}

/// Single-threaded digest of bytes in memory (tests and small inputs).
pub fn digest_bytes(data: &[u8]) -> Hash {
    let leaves: Vec<Hash> = if data.is_empty() {
        vec![leaf(&[])]
    } else {
        data.chunks(CHUNK).map(leaf).collect()
    };
    file_digest(data.len() as u64, &root(&leaves))
}

/// A file's digest with its leaves (for sidecars and for naming the first bad chunk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    pub size: u64,
    pub leaves: Vec<Hash>,
    pub digest: Hash,
}

impl FileDigest {
    pub fn hex(&self) -> String {
        hex::encode(self.digest)
    }
}

/// Digests `file` (of `size` bytes) with `threads` workers. When `copy_to` is given, each
/// chunk is also written to it at the same offset from the same buffer that was hashed: the
/// digest is then exactly the digest of the bytes written. `progress` counts bytes done.
pub fn digest_file(
    file: &File,
    size: u64,
    threads: usize,
    copy_to: Option<&File>,
    progress: Option<&AtomicU64>,
) -> std::io::Result<FileDigest> {
    let n = chunk_count(size);
    let next = AtomicU64::new(0);
    let leaves = Mutex::new(vec![[0u8; 32]; n as usize]);
    let threads = threads.clamp(1, n.min(1024) as usize);
    std::thread::scope(|s| -> std::io::Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> std::io::Result<()> {
                    let mut buf = vec![0u8; CHUNK];
                    let mut done: Vec<(u64, Hash)> = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        let off = i * CHUNK as u64;
                        let len = (size - off.min(size)).min(CHUNK as u64) as usize;
                        let chunk = &mut buf[..len];
                        file.read_exact_at(chunk, off)?;
                        if let Some(dst) = copy_to {
                            dst.write_all_at(chunk, off)?;
                        }
                        done.push((i, leaf(chunk)));
                        if let Some(p) = progress {
                            p.fetch_add(len as u64, Ordering::Relaxed);
                        }
                        if done.len() >= 64 {
                            flush(&leaves, &mut done);
                        }
                    }
                    flush(&leaves, &mut done);
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| std::io::Error::other("hash worker panicked"))??;
        }
        Ok(())
    })?;
    let leaves = leaves
        .into_inner()
        .map_err(|_| std::io::Error::other("poisoned"))?;
    let digest = file_digest(size, &root(&leaves));
    Ok(FileDigest {
        size,
        leaves,
        digest,
    })
}

fn flush(leaves: &Mutex<Vec<Hash>>, done: &mut Vec<(u64, Hash)>) {
    if let Ok(mut l) = leaves.lock() {
        for (i, h) in done.drain(..) {
            l[i as usize] = h;
        }
    }
}

/// Digests the file at `path` with all cores.
pub fn digest_path(path: &std::path::Path, threads: usize) -> std::io::Result<FileDigest> {
    let f = File::open(path)?;
    let size = f.metadata()?.len();
    digest_file(&f, size, threads, None, None)
}

pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn vectors_from_the_independent_reference() {
        let v: serde_json::Value =
            serde_json::from_str(include_str!("../testdata/merkle_vectors.json")).unwrap();
        for (name, case) in v.as_object().unwrap() {
            let size = case["size"].as_u64().unwrap() as usize;
            let want = case["merkle_sha3_256"].as_str().unwrap();
            let data = pattern(size);
            assert_eq!(hex::encode(digest_bytes(&data)), want, "{name} (in memory)");
            let path = std::env::temp_dir().join(format!("rw-vec-{}-{name}", std::process::id()));
            std::fs::write(&path, &data).unwrap();
            for threads in [1, 2, 8] {
                assert_eq!(
                    digest_path(&path, threads).unwrap().hex(),
                    want,
                    "{name} with {threads} threads"
                );
            }
            std::fs::remove_file(&path).unwrap();
        }
    }

    #[test]
    fn tree_shape_is_rfc6962() {
        let l: Vec<Hash> = (0..5u8).map(|i| leaf(&[i])).collect();
        // 5 leaves split at 4: ((01)(23))(4)
        let want = node(&node(&node(&l[0], &l[1]), &node(&l[2], &l[3])), &l[4]);
        assert_eq!(root(&l), want);
        let three = node(&node(&l[0], &l[1]), &l[2]);
        assert_eq!(root(&l[..3]), three);
    }
}
