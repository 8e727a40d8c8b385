//! Access to the three pinned maps. Opened from their pin paths, so a restarted daemon (or
//! the CLI, with the daemon down) sees the same bucket and counters the kernel is using.

use aya::maps::{Array, Map, MapData, PerCpuArray};
use rackwarden_common::{BucketConfig, BucketState, CONFIG_MAGIC, Counters, map_names};

use super::{Direction, LimiterError};
use crate::pins::PinPaths;

pub struct LimiterMaps {
    config: Array<MapData, BucketConfig>,
    state: Array<MapData, BucketState>,
    counters: PerCpuArray<MapData, Counters>,
    /// Kernel map ids, recorded in evidence so an auditor can tie counters to programs.
    pub ids: MapIds,
}

#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct MapIds {
    pub config: u32,
    pub state: u32,
    pub counters: u32,
}

fn open(pins: &PinPaths, name: &str) -> Result<(MapData, u32), LimiterError> {
    let path = pins.map(name);
    let data = MapData::from_pin(&path).map_err(|source| LimiterError::Map {
        path: path.clone(),
        source,
    })?;
    let id = data
        .info()
        .map_err(|source| LimiterError::Map { path, source })?
        .id();
    Ok((data, id))
}

impl LimiterMaps {
    pub fn open(pins: &PinPaths) -> Result<Self, LimiterError> {
        let map_err = |name: &'static str| move |source| LimiterError::MapAccess { name, source };
        let (c, cid) = open(pins, map_names::CONFIG)?;
        let (s, sid) = open(pins, map_names::STATE)?;
        let (k, kid) = open(pins, map_names::COUNTERS)?;
        Ok(LimiterMaps {
            config: Array::try_from(Map::Array(c)).map_err(map_err(map_names::CONFIG))?,
            state: Array::try_from(Map::Array(s)).map_err(map_err(map_names::STATE))?,
            counters: PerCpuArray::try_from(Map::PerCpuArray(k))
                .map_err(map_err(map_names::COUNTERS))?,
            ids: MapIds {
                config: cid,
                state: sid,
                counters: kid,
            },
        })
    }

    pub fn config(&self, dir: Direction) -> Result<BucketConfig, LimiterError> {
        self.config
            .get(&dir.index(), 0)
            .map_err(|source| LimiterError::MapAccess {
                name: map_names::CONFIG,
                source,
            })
    }

    /// Writes a cap. Takes effect on the next packet; the bucket's position (`tat`) is kept,
    /// so a cap change never refills the bucket.
    pub fn set_config(&mut self, dir: Direction, cfg: &BucketConfig) -> Result<(), LimiterError> {
        self.config
            .set(dir.index(), cfg, 0)
            .map_err(|source| LimiterError::MapAccess {
                name: map_names::CONFIG,
                source,
            })
    }

    pub fn state(&self, dir: Direction) -> Result<BucketState, LimiterError> {
        self.state
            .get(&dir.index(), 0)
            .map_err(|source| LimiterError::MapAccess {
                name: map_names::STATE,
                source,
            })
    }

    /// Counters summed over CPUs.
    pub fn counters(&self, dir: Direction) -> Result<Counters, LimiterError> {
        let per_cpu =
            self.counters
                .get(&dir.index(), 0)
                .map_err(|source| LimiterError::MapAccess {
                    name: map_names::COUNTERS,
                    source,
                })?;
        let mut total = Counters::default();
        for c in per_cpu.iter() {
            total.add(c);
        }
        Ok(total)
    }
}

/// The config slot for a cap: precomputes `tau_ns` and stamps the magic.
pub fn bucket_config(rate_bytes_per_s: u64, burst_bytes: u64, generation: u32) -> BucketConfig {
    let tau = (burst_bytes as u128 * 1_000_000_000u128) / rate_bytes_per_s.max(1) as u128;
    BucketConfig {
        rate_bytes_per_s,
        burst_bytes,
        tau_ns: u64::try_from(tau).unwrap_or(u64::MAX),
        generation,
        magic: CONFIG_MAGIC,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tau_is_floor_of_burst_over_rate() {
        let c = bucket_config(1_000_000, 262_144, 1);
        assert_eq!(c.tau_ns, 262_144_000);
        let c = bucket_config(3, 1, 1);
        assert_eq!(c.tau_ns, 333_333_333); // floor, never rounded up
        assert_eq!(c.magic, CONFIG_MAGIC);
    }
}
