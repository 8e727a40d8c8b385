//! Internally tagged enums (`{"state":"present", ...fields}`) read in one pass.
//!
//! serde's derived reader for `#[serde(tag = ...)]` first copies the whole object into a
//! buffer of its own, because the tag may come last, and then reads the variant from that
//! buffer: for a statement's limiter report, most of the statement is parsed twice and
//! allocated once more on the way (half the time of verifying a statement went there).
//! Every writer of ours, serde's included, writes the tag first. When it is first, the
//! variant's fields are read straight from the map that follows it; when it is not (still
//! valid JSON, so still accepted), the other fields are buffered as before and the variant
//! is read from the buffer. Either way the same objects are accepted and refused (the tests
//! hold each reader to serde's derive), but for one thing serde lets through: fields beside
//! the tag of a variant that has none, which `deny_unknown_fields` means to refuse.

use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, MapAccess, Visitor, value::MapAccessDeserializer,
};

/// An enum written as an object whose `TAG` key names the variant.
pub(crate) trait Tagged: Sized {
    const TAG: &'static str;
    const VARIANTS: &'static [&'static str];
    /// What it is, for "expected ..." in errors.
    const EXPECTING: &'static str;
    /// Reads variant `VARIANTS[index]` from the object's other fields.
    fn variant<'de, D: Deserializer<'de>>(index: usize, fields: D) -> Result<Self, D::Error>;
}

/// The `Deserialize` of a [`Tagged`] enum.
pub(crate) fn deserialize<'de, T: Tagged, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
    d.deserialize_map(TaggedVisitor::<T>(std::marker::PhantomData))
}

struct TaggedVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Tagged> Visitor<'de> for TaggedVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        match map.next_key_seed(KeySeed(T::TAG))? {
            None => Err(de::Error::missing_field(T::TAG)),
            Some(Key::Tag) => {
                let index = map.next_value_seed(VariantSeed(T::VARIANTS))?;
                T::variant(index, MapAccessDeserializer::new(map))
            }
            Some(Key::Other(first)) => buffered::<T, A>(first, map),
        }
    }
}

/// The tag came after other fields: keep them, find the tag, then read the variant.
fn buffered<'de, T: Tagged, A: MapAccess<'de>>(first: String, mut map: A) -> Result<T, A::Error> {
    use serde_json::{Map, Value};
    let mut fields = Map::new();
    fields.insert(first, map.next_value::<Value>()?);
    let mut index = None;
    while let Some(key) = map.next_key_seed(KeySeed(T::TAG))? {
        match key {
            Key::Tag if index.is_some() => return Err(de::Error::duplicate_field(T::TAG)),
            Key::Tag => index = Some(map.next_value_seed(VariantSeed(T::VARIANTS))?),
            Key::Other(k) => {
                if fields.contains_key(&k) {
                    return Err(de::Error::custom(format_args!("duplicate field `{k}`")));
                }
                fields.insert(k, map.next_value::<Value>()?);
            }
        }
    }
    let index = index.ok_or_else(|| de::Error::missing_field(T::TAG))?;
    T::variant(index, Value::Object(fields)).map_err(de::Error::custom)
}

enum Key {
    Tag,
    Other(String),
}

struct KeySeed(&'static str);

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(if v == self.0 {
            Key::Tag
        } else {
            Key::Other(v.to_owned())
        })
    }
}

/// The tag's value: the index of the variant it names.
struct VariantSeed(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for VariantSeed {
    type Value = usize;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for VariantSeed {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a variant name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<usize, E> {
        self.0
            .iter()
            .position(|name| *name == v)
            .ok_or_else(|| de::Error::unknown_variant(v, self.0))
    }
}

/// The fields of a variant that has none (`{"kind":"unchallenged"}`): any other is refused.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoFields {}

#[cfg(test)]
mod tests {
    //! Each hand-written reader against serde's derive for the same type, on the same inputs:
    //! the same objects accepted (with the same values), the same refused.
    #![allow(clippy::unwrap_used)]

    use serde::{Deserialize, Serialize, de::DeserializeOwned};

    use crate::evidence::{
        Direction, DirectionCounters, LimiterCounters, LimiterEvidence, LimiterReport,
    };
    use crate::statement::Challenge;

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
    enum DerivedChallenge {
        Nonce { nonce: String },
        Unchallenged,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(tag = "state", rename_all = "snake_case")]
    enum DerivedReport {
        Present(Box<LimiterEvidence>),
        Absent { finding: String },
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct DerivedCounters {
        direction: Direction,
        #[serde(flatten)]
        counters: LimiterCounters,
    }

    /// Both read `json` alike: both refuse it, or both accept it and write the same JSON.
    fn same<Ours: DeserializeOwned + Serialize, Derived: DeserializeOwned + Serialize>(json: &str) {
        let ours = serde_json::from_str::<Ours>(json);
        let derived = serde_json::from_str::<Derived>(json);
        match (&ours, &derived) {
            (Ok(o), Ok(d)) => assert_eq!(
                serde_json::to_string(o).unwrap(),
                serde_json::to_string(d).unwrap(),
                "{json}"
            ),
            (Err(_), Err(_)) => {}
            _ => panic!(
                "{json}: ours {:?}, derived {:?}",
                ours.as_ref().err(),
                derived.as_ref().err()
            ),
        }
    }

    #[test]
    fn challenge_reads_as_the_derive_does() {
        for json in [
            r#"{"kind":"nonce","nonce":"ab"}"#,
            r#"{"nonce":"ab","kind":"nonce"}"#,
            r#"{"kind":"unchallenged"}"#,
            r#"{"kind":"nonce"}"#,
            r#"{"kind":"nonce","nonce":"ab","x":1}"#,
            r#"{"kind":"nonce","nonce":"ab","nonce":"cd"}"#,
            r#"{"kind":"nonce","kind":"nonce","nonce":"ab"}"#,
            r#"{"nonce":"ab","kind":"nonce","kind":"nonce"}"#,
            r#"{"nonce":"ab","nonce":"ab","kind":"nonce"}"#,
            r#"{"kind":"fresh"}"#,
            r#"{"kind":7}"#,
            r#"{"nonce":"ab"}"#,
            r#"{}"#,
            r#"[]"#,
            r#""nonce""#,
            r#"null"#,
        ] {
            same::<Challenge, DerivedChallenge>(json);
        }
        // The one difference, on purpose: serde's derive lets a unit variant carry fields its
        // `deny_unknown_fields` should refuse; ours refuses them.
        let json = r#"{"kind":"unchallenged","nonce":"ab"}"#;
        assert!(serde_json::from_str::<DerivedChallenge>(json).is_ok());
        let err = serde_json::from_str::<Challenge>(json)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `nonce`"), "{err}");
    }

    #[test]
    fn limiter_report_reads_as_the_derive_does() {
        let counters = r#"[{"direction":"egress","passed_bytes":1,"passed_packets":2,"dropped_bytes":3,"dropped_packets":4,"unconfigured_drops":5,"contention_drops":6}]"#;
        let fields = format!(
            r#""attach_kind":"tcx","pin_root":"/sys/fs/bpf/rw","programs":[],"attach_points":[],"caps":[],"counters":{counters},"gaps":[]"#
        );
        for json in [
            format!(r#"{{"state":"present",{fields}}}"#),
            format!(r#"{{{fields},"state":"present"}}"#),
            format!(r#"{{"state":"present",{fields},"x":1}}"#),
            format!(r#"{{"state":"present",{fields},"state":"present"}}"#),
            format!(r#"{{"state":"absent",{fields}}}"#),
            r#"{"state":"absent","finding":"no limiter"}"#.into(),
            r#"{"finding":"no limiter","state":"absent"}"#.into(),
            r#"{"state":"absent","finding":"no limiter","other":[1,{"a":2}]}"#.into(),
            r#"{"state":"absent","finding":"no limiter","state":"absent"}"#.into(),
            r#"{"finding":"no limiter","state":"absent","state":"absent"}"#.into(),
            r#"{"finding":"a","finding":"b","state":"absent"}"#.into(),
            r#"{"state":"absent"}"#.into(),
            r#"{"state":"gone","finding":"x"}"#.into(),
            r#"{"finding":"x"}"#.into(),
            r#"{"state":"present"}"#.into(),
        ] {
            same::<LimiterReport, DerivedReport>(&json);
        }
    }

    #[test]
    fn direction_counters_read_and_write_as_flatten_did() {
        let c = DirectionCounters {
            direction: Direction::Ingress,
            counters: LimiterCounters {
                passed_bytes: 1,
                passed_packets: 2,
                dropped_bytes: 3,
                dropped_packets: 4,
                unconfigured_drops: 5,
                contention_drops: u64::MAX,
            },
        };
        let derived = DerivedCounters {
            direction: c.direction,
            counters: c.counters,
        };
        let written = serde_json::to_string(&c).unwrap();
        assert_eq!(written, serde_json::to_string(&derived).unwrap());
        let body = r#""passed_bytes":1,"passed_packets":2,"dropped_bytes":3,"dropped_packets":4,"unconfigured_drops":5,"contention_drops":6"#;
        for json in [
            written,
            format!(r#"{{"direction":"egress",{body}}}"#),
            format!(r#"{{{body},"direction":"egress"}}"#),
            format!(r#"{{"direction":"egress",{body},"x":1}}"#),
            format!(r#"{{"direction":"egress",{body},"passed_bytes":1}}"#),
            format!(r#"{{"direction":"up",{body}}}"#),
            format!(r#"{{{body}}}"#),
            r#"{"direction":"egress","passed_bytes":1}"#.into(),
        ] {
            same::<DirectionCounters, DerivedCounters>(&json);
        }
    }
}
