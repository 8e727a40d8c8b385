//! Compact JSON out of `Serialize`, byte for byte what `serde_json::to_writer` writes, for the
//! statement a host signs each epoch.
//!
//! serde_json escapes every string byte by byte through a table, keys included; a statement is
//! about 90 strings, nearly all plain ASCII, and that loop was half of writing one. Here a
//! string is checked for anything to escape sixteen bytes at a time and, when there is none
//! (every key, digest, name and id we write), copied whole. Anything this writer does not take
//! (a map key that is not a string or an integer, a float, serde_json's own raw values) is an
//! error, and [`to_vec`] then leaves the whole value to serde_json, so the output never depends
//! on which path wrote it. The tests hold the two equal on statements and on every kind of string.

use serde::ser::{self, Serialize};

/// `value` as compact JSON, written here where it can be and by serde_json otherwise.
pub fn to_vec<T: Serialize + ?Sized>(value: &T, capacity: usize) -> serde_json::Result<Vec<u8>> {
    let mut w = Writer {
        out: Vec::with_capacity(capacity),
    };
    match value.serialize(&mut w) {
        Ok(()) => Ok(w.out),
        Err(Unsupported) => {
            let mut out = Vec::with_capacity(capacity);
            serde_json::to_writer(&mut out, value)?;
            Ok(out)
        }
    }
}

/// Something this writer leaves to serde_json (which also words any real error).
#[derive(Debug)]
pub struct Unsupported;

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("left to serde_json")
    }
}

impl std::error::Error for Unsupported {}

impl ser::Error for Unsupported {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Unsupported
    }
}

struct Writer {
    out: Vec<u8>,
}

impl Writer {
    fn int(&mut self, v: impl itoa::Integer) -> Result<(), Unsupported> {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        Ok(())
    }

    fn str(&mut self, s: &str) {
        self.out.push(b'"');
        let bytes = s.as_bytes();
        if needs_escape(bytes) {
            escape_into(&mut self.out, bytes);
        } else {
            self.out.extend_from_slice(bytes);
        }
        self.out.push(b'"');
    }
}

/// Whether any byte is a control character, `"` or `\`. Without early exit, so the compiler
/// checks sixteen bytes per step.
fn needs_escape(bytes: &[u8]) -> bool {
    let hit = |b: &u8| (*b < 0x20) | (*b == b'"') | (*b == b'\\');
    let mut chunks = bytes.chunks_exact(16);
    for c in &mut chunks {
        if c.iter().fold(false, |acc, b| acc | hit(b)) {
            return true;
        }
    }
    chunks.remainder().iter().any(hit)
}

/// serde_json's escapes: the two-character forms where JSON has one, `\u00xx` (lowercase hex)
/// for the other control characters; everything else, non-ASCII included, as it is.
fn escape_into(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0..=0x1f => 0,
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        if short != 0 {
            out.extend_from_slice(&[b'\\', short]);
        } else {
            out.extend_from_slice(b"\\u00");
            out.extend_from_slice(&[HEX[(b >> 4) as usize], HEX[(b & 0xf) as usize]]);
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

/// `serialize_i8` to `serialize_u128`, each a call of `$write` with the value.
macro_rules! integers {
    ($write:ident) => {
        integers!($write; serialize_i8: i8, serialize_i16: i16, serialize_i32: i32,
            serialize_i64: i64, serialize_i128: i128, serialize_u8: u8, serialize_u16: u16,
            serialize_u32: u32, serialize_u64: u64, serialize_u128: u128);
    };
    ($write:ident; $($name:ident: $t:ty),*) => {$(
        fn $name(self, v: $t) -> Result<(), Unsupported> {
            self.$write(v)
        }
    )*};
}

/// An array or object being written: whether a comma comes before the next element, and
/// whether it is the inside of `{"variant": ...}`, which needs one more `}`.
struct Compound<'a> {
    w: &'a mut Writer,
    first: bool,
    variant: bool,
}

impl<'a> Compound<'a> {
    fn open(w: &'a mut Writer, bracket: u8, variant: Option<&str>) -> Compound<'a> {
        if let Some(name) = variant {
            w.out.push(b'{');
            w.str(name);
            w.out.push(b':');
        }
        w.out.push(bracket);
        Compound {
            w,
            first: true,
            variant: variant.is_some(),
        }
    }

    fn comma(&mut self) {
        if !self.first {
            self.w.out.push(b',');
        }
        self.first = false;
    }

    fn close(self, bracket: u8) {
        self.w.out.push(bracket);
        if self.variant {
            self.w.out.push(b'}');
        }
    }

    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unsupported> {
        self.comma();
        value.serialize(&mut *self.w)
    }

    fn field<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> Result<(), Unsupported> {
        self.comma();
        self.w.str(key);
        self.w.out.push(b':');
        value.serialize(&mut *self.w)
    }
}

impl<'a> ser::Serializer for &'a mut Writer {
    type Ok = ();
    type Error = Unsupported;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    integers!(int);

    fn serialize_bool(self, v: bool) -> Result<(), Unsupported> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    // Floats: serde_json's formatting (ryu, null for non-finite) is left to it.
    fn serialize_f32(self, _: f32) -> Result<(), Unsupported> {
        Err(Unsupported)
    }
    fn serialize_f64(self, _: f64) -> Result<(), Unsupported> {
        Err(Unsupported)
    }
    fn serialize_char(self, v: char) -> Result<(), Unsupported> {
        self.str(v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Unsupported> {
        self.str(v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Unsupported> {
        let mut seq = Compound::open(self, b'[', None);
        for b in v {
            seq.element(b)?;
        }
        seq.close(b']');
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Unsupported> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Unsupported> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Unsupported> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Unsupported> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), Unsupported> {
        self.str(variant);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Unsupported> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Unsupported> {
        let mut obj = Compound::open(self, b'{', None);
        obj.field(variant, value)?;
        obj.close(b'}');
        Ok(())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Compound<'a>, Unsupported> {
        Ok(Compound::open(self, b'[', None))
    }
    fn serialize_tuple(self, _: usize) -> Result<Compound<'a>, Unsupported> {
        Ok(Compound::open(self, b'[', None))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Compound<'a>, Unsupported> {
        Ok(Compound::open(self, b'[', None))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Compound<'a>, Unsupported> {
        Ok(Compound::open(self, b'[', Some(variant)))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Compound<'a>, Unsupported> {
        Ok(Compound::open(self, b'{', None))
    }
    fn serialize_struct(self, name: &'static str, _: usize) -> Result<Compound<'a>, Unsupported> {
        // serde_json's own RawValue and arbitrary-precision Number pass through here under a
        // private name and must be written raw: that is serde_json's to do.
        if name.starts_with("$serde_json::private::") {
            return Err(Unsupported);
        }
        Ok(Compound::open(self, b'{', None))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Compound<'a>, Unsupported> {
        Ok(Compound::open(self, b'{', Some(variant)))
    }
}

/// The four array-like traits differ only in their method's name.
macro_rules! array_like {
    ($($tr:ident :: $method:ident),*) => {$(
        impl ser::$tr for Compound<'_> {
            type Ok = ();
            type Error = Unsupported;
            fn $method<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Unsupported> {
                self.element(v)
            }
            fn end(self) -> Result<(), Unsupported> {
                self.close(b']');
                Ok(())
            }
        }
    )*};
}

array_like!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = Unsupported;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Unsupported> {
        self.comma();
        key.serialize(KeyWriter(&mut *self.w))?;
        self.w.out.push(b':');
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Unsupported> {
        v.serialize(&mut *self.w)
    }
    fn end(self) -> Result<(), Unsupported> {
        self.close(b'}');
        Ok(())
    }
}

/// A struct and a struct variant's fields are written alike.
macro_rules! object_like {
    ($($tr:ident),*) => {$(
        impl ser::$tr for Compound<'_> {
            type Ok = ();
            type Error = Unsupported;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                v: &T,
            ) -> Result<(), Unsupported> {
                self.field(key, v)
            }
            fn end(self) -> Result<(), Unsupported> {
                self.close(b'}');
                Ok(())
            }
        }
    )*};
}

object_like!(SerializeStruct, SerializeStructVariant);

/// A map key: strings (and what serde writes as one, a unit variant or a newtype around a
/// string) as they are, integers quoted, as serde_json writes them; anything else is left to
/// serde_json.
struct KeyWriter<'a>(&'a mut Writer);

impl KeyWriter<'_> {
    fn quoted_int(self, v: impl itoa::Integer) -> Result<(), Unsupported> {
        self.0.out.push(b'"');
        self.0.int(v)?;
        self.0.out.push(b'"');
        Ok(())
    }
}

impl ser::Serializer for KeyWriter<'_> {
    type Ok = ();
    type Error = Unsupported;
    type SerializeSeq = ser::Impossible<(), Unsupported>;
    type SerializeTuple = ser::Impossible<(), Unsupported>;
    type SerializeTupleStruct = ser::Impossible<(), Unsupported>;
    type SerializeTupleVariant = ser::Impossible<(), Unsupported>;
    type SerializeMap = ser::Impossible<(), Unsupported>;
    type SerializeStruct = ser::Impossible<(), Unsupported>;
    type SerializeStructVariant = ser::Impossible<(), Unsupported>;

    integers!(quoted_int);

    fn serialize_str(self, v: &str) -> Result<(), Unsupported> {
        self.0.str(v);
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Unsupported> {
        self.0.str(v.encode_utf8(&mut [0; 4]));
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), Unsupported> {
        self.0.str(variant);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Unsupported> {
        value.serialize(self)
    }
    fn serialize_bool(self, _: bool) -> Result<(), Unsupported> {
        Err(Unsupported)
    }
    fn serialize_f32(self, _: f32) -> Result<(), Unsupported> {
        Err(Unsupported)
    }
    fn serialize_f64(self, _: f64) -> Result<(), Unsupported> {
        Err(Unsupported)
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), Unsupported> {
        Err(Unsupported)
    }
    fn serialize_none(self) -> Result<(), Unsupported> {
        Err(Unsupported)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<(), Unsupported> {
        Err(Unsupported)
    }
    fn serialize_unit(self) -> Result<(), Unsupported> {
        Err(Unsupported)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Unsupported> {
        Err(Unsupported)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), Unsupported> {
        Err(Unsupported)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Unsupported> {
        Err(Unsupported)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Unsupported> {
        Err(Unsupported)
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Unsupported> {
        Err(Unsupported)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Unsupported> {
        Err(Unsupported)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Unsupported> {
        Err(Unsupported)
    }
    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, Unsupported> {
        Err(Unsupported)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Unsupported> {
        Err(Unsupported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Serialize;
    use std::collections::BTreeMap;

    fn same<T: Serialize + ?Sized>(v: &T) {
        let ours = to_vec(v, 0).unwrap();
        let theirs = serde_json::to_vec(v).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&theirs)
        );
    }

    #[derive(Serialize)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    enum Tagged {
        Unit,
        Fields { a: u8, b: Option<String> },
    }

    #[derive(Serialize)]
    enum External {
        Unit,
        New(i64),
        Tuple(u8, bool),
        Fields { x: Vec<u8> },
    }

    #[derive(Serialize)]
    struct Everything {
        b: bool,
        i: [i64; 3],
        u: (u8, u16, u32, u64, u128, i128),
        c: char,
        s: String,
        none: Option<u8>,
        some: Option<&'static str>,
        unit: (),
        tagged: Vec<Tagged>,
        external: Vec<External>,
        map: BTreeMap<String, u32>,
        int_keys: BTreeMap<u16, bool>,
        #[serde(with = "serde_bytes_like")]
        bytes: Vec<u8>,
        #[serde(skip_serializing_if = "Option::is_none")]
        skipped: Option<u8>,
    }

    mod serde_bytes_like {
        pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
    }

    #[test]
    fn every_shape_is_written_as_serde_json_writes_it() {
        same(&Everything {
            b: true,
            i: [i64::MIN, -1, i64::MAX],
            u: (u8::MAX, 0, u32::MAX, u64::MAX, u128::MAX, i128::MIN),
            c: '\u{1}',
            s: "a\"b\\c\u{8}\u{c}\n\r\t\u{1f}\u{7f}é😀/".into(),
            none: None,
            some: Some("x"),
            unit: (),
            tagged: vec![
                Tagged::Unit,
                Tagged::Fields {
                    a: 1,
                    b: Some("q".into()),
                },
            ],
            external: vec![
                External::Unit,
                External::New(-5),
                External::Tuple(1, false),
                External::Fields { x: vec![1, 2] },
            ],
            map: [("k\n".to_string(), 1), ("".to_string(), 2)].into(),
            int_keys: [(7, true)].into(),
            bytes: vec![0, 255],
            skipped: None,
        });
        same(&Vec::<u8>::new());
        same(&BTreeMap::<String, String>::new());
    }

    #[test]
    fn what_it_does_not_take_is_left_to_serde_json() {
        let raw = serde_json::value::RawValue::from_string("[1, {\"a\": 2}]".into()).unwrap();
        same(&vec![raw.clone(), raw]);
        same(&[1.5f64, f64::NAN]);
        same(&BTreeMap::from([(true, 1)]));
        assert_eq!(to_vec(&0.1f32, 0).unwrap(), b"0.1");
    }

    #[test]
    fn a_statement_is_written_as_serde_json_writes_it() {
        // Every field of the schema present, every Option Some.
        same(&crate::schema::example_statement());
    }

    proptest! {
        #[test]
        fn any_string_is_escaped_as_serde_json_escapes_it(s in any::<String>(), key in "[\\x00-\\x7f]{0,40}") {
            same(&s);
            same(&BTreeMap::from([(key, s)]));
        }

        #[test]
        fn control_characters_at_any_place_in_long_strings(
            base in "[a-z0-9]{0,70}",
            at in 0usize..71,
            c in 0u8..0x20,
        ) {
            let mut s = base.clone();
            s.insert(at.min(base.len()), c as char);
            same(&s);
        }
    }
}
