//! The RFC 6962 test tree (certificate-transparency-go's merkle tests: eight leaves, their
//! roots at every size, and proofs), and every proof of every pair of sizes up to 64.

use super::tile::{
    FetchError, TILE_WIDTH, TileFetchError, TileKind, TilePath, TileReader, encode_bundle, tiles_of,
};
use super::*;

fn h(s: &str) -> Hash {
    from_hex(s).unwrap()
}

fn leaves() -> Vec<Vec<u8>> {
    [
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    ]
    .iter()
    .map(|s| ::hex::decode(s).unwrap())
    .collect()
}

const ROOTS: [&str; 9] = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
];

fn tree(n: usize) -> MemoryTree {
    let mut t = MemoryTree::new();
    for l in leaves().iter().take(n) {
        t.push(l);
    }
    t
}

#[test]
fn roots_of_the_rfc6962_test_tree() {
    for (n, root) in ROOTS.iter().enumerate() {
        assert_eq!(hex(&tree(n).root()), *root, "size {n}");
    }
    assert_eq!(empty_root(), h(ROOTS[0]));
}

#[test]
fn inclusion_proofs_of_the_test_tree() {
    // (leaf index, tree size, proof)
    let cases: [(u64, u64, &[&str]); 5] = [
        (0, 1, &[]),
        (
            0,
            8,
            &[
                "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
            ],
        ),
        (
            5,
            8,
            &[
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
                "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            ],
        ),
        (
            2,
            3,
            &["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"],
        ),
        (
            1,
            5,
            &[
                "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            ],
        ),
    ];
    let all = leaves();
    for (index, size, proof) in cases {
        let t = tree(size as usize);
        let want: Vec<Hash> = proof.iter().map(|s| h(s)).collect();
        assert_eq!(
            inclusion_proof(&t, index, size).unwrap(),
            want,
            "{index}/{size}"
        );
        let leaf = leaf_hash(&all[index as usize]);
        verify_inclusion(&leaf, index, size, &want, &h(ROOTS[size as usize])).unwrap();
    }
}

#[test]
fn consistency_proofs_of_the_test_tree() {
    let cases: [(u64, u64, &[&str]); 4] = [
        (1, 1, &[]),
        (
            1,
            8,
            &[
                "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
            ],
        ),
        (
            6,
            8,
            &[
                "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            ],
        ),
        (
            2,
            5,
            &[
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            ],
        ),
    ];
    let t = tree(8);
    for (m, n, proof) in cases {
        let want: Vec<Hash> = proof.iter().map(|s| h(s)).collect();
        assert_eq!(consistency_proof(&t, m, n).unwrap(), want, "{m}->{n}");
        verify_consistency(m, n, &h(ROOTS[m as usize]), &h(ROOTS[n as usize]), &want).unwrap();
    }
}

fn big_tree(n: u64) -> MemoryTree {
    let mut t = MemoryTree::new();
    for i in 0..n {
        t.push(format!("leaf {i}").as_bytes());
    }
    t
}

/// Flips one bit of one hash (or of the claimed root) and the proof must fail.
fn tamper(proof: &[Hash], which: usize) -> Vec<Hash> {
    let mut p = proof.to_vec();
    p[which][which % 32] ^= 1;
    p
}

#[test]
fn every_inclusion_proof_up_to_64_verifies_and_tampered_ones_fail() {
    let full = big_tree(64);
    for n in 1..=64u64 {
        let t = big_tree(n);
        let root = t.root();
        assert_eq!(root, tree_hash(&full, n).unwrap());
        for i in 0..n {
            let leaf = t.node(0, i).unwrap();
            let p = inclusion_proof(&full, i, n).unwrap();
            verify_inclusion(&leaf, i, n, &p, &root).unwrap();
            for w in 0..p.len() {
                assert!(verify_inclusion(&leaf, i, n, &tamper(&p, w), &root).is_err());
            }
            let mut other = root;
            other[0] ^= 1;
            assert!(verify_inclusion(&leaf, i, n, &p, &other).is_err());
            if n > 1 {
                // Another index, or a proof one hash short or long, is refused.
                assert!(verify_inclusion(&leaf, (i + 1) % n, n, &p, &root).is_err());
                assert!(verify_inclusion(&leaf, i, n, &p[1..], &root).is_err());
                let mut long = p.clone();
                long.push(root);
                assert!(verify_inclusion(&leaf, i, n, &long, &root).is_err());
            }
            assert!(verify_inclusion(&leaf, n, n, &p, &root).is_err());
        }
    }
}

#[test]
fn every_consistency_proof_up_to_64_verifies_and_tampered_ones_fail() {
    let full = big_tree(64);
    let roots: Vec<Hash> = (0..=64).map(|n| tree_hash(&full, n).unwrap()).collect();
    for n in 0..=64u64 {
        for m in 0..=n {
            let p = consistency_proof(&full, m, n).unwrap();
            let (old, new) = (roots[m as usize], roots[n as usize]);
            verify_consistency(m, n, &old, &new, &p).unwrap();
            for w in 0..p.len() {
                assert!(
                    verify_consistency(m, n, &old, &new, &tamper(&p, w)).is_err(),
                    "{m}->{n} hash {w}"
                );
            }
            if m > 0 && m < n {
                let mut bad_old = old;
                bad_old[3] ^= 1;
                assert!(verify_consistency(m, n, &bad_old, &new, &p).is_err());
                let mut bad_new = new;
                bad_new[3] ^= 1;
                assert!(verify_consistency(m, n, &old, &bad_new, &p).is_err());
                assert!(verify_consistency(m, n, &old, &new, &p[1..]).is_err());
                let mut long = p.clone();
                long.push(new);
                assert!(verify_consistency(m, n, &old, &new, &long).is_err());
                // A tree whose old part was rewritten is not consistent with the old root.
                let mut rewritten = MemoryTree::new();
                for i in 0..n {
                    let data = if i == m - 1 {
                        "rewritten".to_string()
                    } else {
                        format!("leaf {i}")
                    };
                    rewritten.push(data.as_bytes());
                }
                let p2 = consistency_proof(&rewritten, m, n).unwrap();
                assert!(verify_consistency(m, n, &old, &rewritten.root(), &p2).is_err());
            }
        }
    }
    assert!(consistency_proof(&full, 3, 2).is_err());
    assert!(verify_consistency(3, 2, &roots[3], &roots[2], &[]).is_err());
    assert!(verify_consistency(3, 3, &roots[3], &roots[2], &[]).is_err());
}

#[test]
fn completed_nodes_build_the_same_tree() {
    // A store that keeps only complete nodes (as the verifier's does).
    #[derive(Default)]
    struct Nodes(std::collections::HashMap<(u32, u64), Hash>);
    impl HashReader for Nodes {
        fn node(&self, level: u32, index: u64) -> Result<Hash, TlogError> {
            self.0
                .get(&(level, index))
                .copied()
                .ok_or(TlogError::MissingNode { level, index })
        }
    }
    let mut nodes = Nodes::default();
    let mem = big_tree(300);
    for i in 0..300u64 {
        let leaf = mem.node(0, i).unwrap();
        let new = completed_nodes(&nodes, i, leaf).unwrap();
        nodes.0.insert((0, i), leaf);
        for (l, j, hash) in new {
            nodes.0.insert((l, j), hash);
        }
        let n = i + 1;
        assert_eq!(tree_hash(&nodes, n).unwrap(), tree_hash(&mem, n).unwrap());
        if n % 37 == 0 {
            assert_eq!(
                consistency_proof(&nodes, n / 2, n).unwrap(),
                consistency_proof(&mem, n / 2, n).unwrap()
            );
            assert_eq!(
                inclusion_proof(&nodes, n / 3, n).unwrap(),
                inclusion_proof(&mem, n / 3, n).unwrap()
            );
        }
    }
}

/// Serves a tree's tiles as a static publisher would.
fn serve(t: &MemoryTree, data: &[Vec<u8>], path: &str) -> Result<Vec<u8>, FetchError> {
    let tp = TilePath::parse(path)?;
    let start = tp.index * TILE_WIDTH;
    let end = start + u64::from(tp.width);
    match tp.kind {
        TileKind::Entries => Ok(encode_bundle(&data[start as usize..end as usize])?),
        TileKind::Hashes(l) => {
            let mut out = Vec::new();
            for i in start..end {
                out.extend_from_slice(&t.node(8 * u32::from(l), i)?);
            }
            Ok(out)
        }
    }
}

#[test]
fn a_tree_read_from_its_tiles_has_the_same_root_and_proofs() {
    let n = 70_000u64;
    let data: Vec<Vec<u8>> = (0..n).map(|i| format!("e{i}").into_bytes()).collect();
    let mut t = MemoryTree::new();
    for d in &data {
        t.push(d);
    }
    for size in [1u64, 255, 256, 257, 65_535, 65_536, 70_000] {
        let tiles = TileReader::new(size, |p: &str| serve(&t, &data, p));
        assert_eq!(
            tree_hash(&tiles, size).unwrap(),
            tree_hash(&t, size).unwrap(),
            "{size}"
        );
        assert_eq!(
            inclusion_proof(&tiles, size - 1, size).unwrap(),
            inclusion_proof(&t, size - 1, size).unwrap()
        );
        assert_eq!(
            consistency_proof(&tiles, size / 2, size).unwrap(),
            consistency_proof(&t, size / 2, size).unwrap()
        );
        let last_tile = (size - 1) / TILE_WIDTH;
        let entries = tiles.entries(last_tile).unwrap();
        assert_eq!(entries.last(), data.get(size as usize - 1));
    }
    assert!(tiles_of(257).iter().any(|p| p.path() == "tile/0/001.p/1"));
    assert!(tiles_of(257).iter().any(|p| p.path() == "tile/1/000.p/1"));
}

#[test]
fn a_tile_the_fetcher_cannot_supply_is_named_with_the_fetchers_own_error() {
    let mut t = MemoryTree::new();
    for i in 0..300u32 {
        t.push(&i.to_be_bytes());
    }
    // A fetcher with its own error type: a missing file.
    let tiles = TileReader::new(300, |p: &str| -> Result<Vec<u8>, std::io::Error> {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no file for {p}"),
        ))
    });
    let e = tree_hash(&tiles, 300).unwrap_err();
    let TlogError::Fetch(TileFetchError { path, source }) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(path, "tile/1/000.p/1");
    let io = source.downcast_ref::<std::io::Error>().unwrap();
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    assert_eq!(
        e.to_string(),
        "reading the log: tile/1/000.p/1: no file for tile/1/000.p/1"
    );
    // A fetcher that answers with a message still works (the verifier's CLI does).
    let tiles = TileReader::new(300, |_: &str| -> Result<Vec<u8>, String> {
        Err("503".into())
    });
    assert_eq!(
        tiles.entries(0).unwrap_err().to_string(),
        "reading the log: tile/entries/000: 503"
    );
}
