//! Access to the three pinned maps. Opened from their pin paths, so a restarted daemon (or
//! the CLI, with the daemon down) sees the same bucket and counters the kernel is using.

use aya::maps::{Array, Map, MapData, PerCpuArray};
use rackwarden_common::{
    BucketConfig, BucketState, CONFIG_MAGIC, Counters, LimiterConfig, map_names,
};

use super::{Direction, HookDirection, LimiterError};
use crate::{config::CapSpec, pins::PinPaths};

pub struct LimiterMaps {
    config: Array<MapData, LimiterConfig>,
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

fn open(pins: &PinPaths, name: &str, next: bool) -> Result<(MapData, u32), LimiterError> {
    let path = if next {
        pins.map_next(name)
    } else {
        pins.map(name)
    };
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
        Self::open_generation(pins, false)
    }

    /// `next`: with the config map of a cap change or upgrade in progress.
    pub(crate) fn open_generation(pins: &PinPaths, next: bool) -> Result<Self, LimiterError> {
        let map_err = |name: &'static str| move |source| LimiterError::MapAccess { name, source };
        let (c, cid) = open(pins, map_names::CONFIG, next)?;
        let (s, sid) = open(pins, map_names::STATE, false)?;
        let (k, kid) = open(pins, map_names::COUNTERS, false)?;
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
            .get(&0, 0)
            .map(|c| *c.get(dir.index()))
            .map_err(|source| LimiterError::MapAccess {
                name: map_names::CONFIG,
                source,
            })
    }

    /// Both directions' config slots, indexed by [`HookDirection::index`].
    pub fn configs(&self) -> Result<FrozenCaps, LimiterError> {
        Ok([
            self.config(Direction::Egress)?,
            self.config(Direction::Ingress)?,
        ])
    }

    /// Writes a cap into the config map. Only a map that is not frozen yet accepts it: the
    /// daemon writes a new generation's map once, before freezing it, and every other writer
    /// (another root process included) is refused with EPERM. Kept public so the tests can
    /// show exactly that.
    pub fn set_config(&mut self, dir: Direction, cfg: &BucketConfig) -> Result<(), LimiterError> {
        let err = |source| LimiterError::MapAccess {
            name: map_names::CONFIG,
            source,
        };
        let mut all = self.config.get(&0, 0).map_err(err)?;
        *all.get_mut(dir.index()) = *cfg;
        self.config.set(0, all, 0).map_err(err)
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
        let mut total = Counters::default();
        for c in self.counters_per_cpu(dir)? {
            total.add(&c);
        }
        Ok(total)
    }

    /// Each possible CPU's counters, by CPU number: what the tap's epoch cut matches frame by
    /// frame (`crate::taps::ring`).
    pub fn counters_per_cpu(&self, dir: Direction) -> Result<Vec<Counters>, LimiterError> {
        let per_cpu =
            self.counters
                .get(&dir.index(), 0)
                .map_err(|source| LimiterError::MapAccess {
                    name: map_names::COUNTERS,
                    source,
                })?;
        Ok(per_cpu.iter().copied().collect())
    }
}

/// The two config slots a policer generation is loaded with (egress, ingress), frozen into
/// its config map: changing a cap means loading a new generation.
pub type FrozenCaps = [BucketConfig; 2];

/// What a direction's slot holds in a new generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapSlot {
    /// No cap: the policer drops every packet (fail closed). Only tests load this.
    Unset,
    Cap(CapSpec),
}

/// The slots for `want`, numbered on from `current` (what is pinned, if anything): a slot
/// that does not change keeps its generation, one that changes gets the next.
pub fn next_generation(current: Option<&FrozenCaps>, want: &[CapSlot; 2]) -> FrozenCaps {
    let mut out = [BucketConfig::default(); 2];
    for (i, slot) in want.iter().enumerate() {
        let cur = current.map(|c| c[i]).unwrap_or_default();
        let at = |generation| match slot {
            CapSlot::Unset => BucketConfig {
                generation,
                ..BucketConfig::default()
            },
            CapSlot::Cap(spec) => bucket_config(spec, generation),
        };
        out[i] = if at(cur.generation) == cur {
            cur
        } else {
            at(cur.generation.wrapping_add(1))
        };
    }
    out
}

fn as_ns(bytes: u64, rate: u64) -> u64 {
    let ns = (bytes as u128 * 1_000_000_000u128) / rate.max(1) as u128;
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// The config slot for a cap: precomputes the bucket depths as time (floor: conservative)
/// and stamps the magic.
pub fn bucket_config(spec: &CapSpec, generation: u32) -> BucketConfig {
    let reserve = spec
        .small_reserve_bytes
        .min(spec.burst_bytes)
        .min(u32::MAX as u64);
    BucketConfig {
        rate_bytes_per_s: spec.rate_bytes_per_s,
        burst_bytes: spec.burst_bytes,
        tau_ns: as_ns(spec.burst_bytes, spec.rate_bytes_per_s),
        bulk_tau_ns: as_ns(spec.burst_bytes - reserve, spec.rate_bytes_per_s),
        small_max_len: spec.small_max_len,
        generation,
        magic: CONFIG_MAGIC,
        small_reserve_bytes: reserve as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_changes_only_with_its_cap() {
        let spec = CapSpec {
            rate_bytes_per_s: 1_000_000,
            burst_bytes: 262_144,
            small_reserve_bytes: 16_384,
            small_max_len: 1024,
        };
        let first = next_generation(None, &[CapSlot::Cap(spec), CapSlot::Cap(spec)]);
        assert_eq!((first[0].generation, first[1].generation), (1, 1));
        assert_eq!(
            next_generation(Some(&first), &[CapSlot::Cap(spec), CapSlot::Cap(spec)]),
            first
        );
        let faster = CapSpec {
            rate_bytes_per_s: 2_000_000,
            ..spec
        };
        let second = next_generation(Some(&first), &[CapSlot::Cap(faster), CapSlot::Cap(spec)]);
        assert_eq!((second[0].generation, second[1].generation), (2, 1));
        assert_eq!(second[0].rate_bytes_per_s, 2_000_000);
        let unset = next_generation(None, &[CapSlot::Unset, CapSlot::Unset]);
        assert_ne!(unset[0].magic, CONFIG_MAGIC, "an unset slot fails closed");
    }

    #[test]
    fn tau_is_floor_of_burst_over_rate() {
        let spec = |rate, burst, reserve| CapSpec {
            rate_bytes_per_s: rate,
            burst_bytes: burst,
            small_reserve_bytes: reserve,
            small_max_len: 1024,
        };
        let c = bucket_config(&spec(1_000_000, 262_144, 16_384), 1);
        assert_eq!(c.tau_ns, 262_144_000);
        assert_eq!(c.bulk_tau_ns, 245_760_000);
        let c = bucket_config(&spec(3, 1, 0), 1);
        assert_eq!(c.tau_ns, 333_333_333); // floor, never rounded up
        assert_eq!(c.magic, CONFIG_MAGIC);
    }
}
