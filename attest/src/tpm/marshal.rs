//! A bounds-checked reader over TPM marshalled bytes (big-endian, TPM 2.0 Part 2) that reports
//! every failure with the structure name, field name and absolute byte offset. The IMA list is
//! host-endian (little-endian on x86), so the reader has `_le` variants too.

use super::error::TpmError;

pub(crate) struct Reader<'a> {
    what: &'static str,
    buf: &'a [u8],
    pos: usize,
    /// Offset of `buf[0]` in the outer blob, so nested readers report absolute offsets.
    base: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(what: &'static str, buf: &'a [u8]) -> Self {
        Self::with_base(what, buf, 0)
    }

    pub(crate) fn with_base(what: &'static str, buf: &'a [u8], base: usize) -> Self {
        Reader {
            what,
            buf,
            pos: 0,
            base,
        }
    }

    /// The absolute offset of the next byte.
    pub(crate) fn offset(&self) -> usize {
        self.base + self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], TpmError> {
        if self.remaining() < n {
            return Err(TpmError::Truncated {
                what: self.what,
                field,
                offset: self.offset(),
                need: n,
                have: self.remaining(),
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], TpmError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(field, N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, TpmError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, TpmError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, TpmError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, TpmError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u32_le(&mut self, field: &'static str) -> Result<u32, TpmError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    /// A TPM2B: `u16 size` then that many bytes.
    pub(crate) fn tpm2b(&mut self, field: &'static str) -> Result<&'a [u8], TpmError> {
        let n = self.u16(field)?;
        self.take(field, usize::from(n))
    }

    /// A u16 that must have one value (a tag, an algorithm); the error names both.
    pub(crate) fn expect_u16(&mut self, field: &'static str, want: u16) -> Result<(), TpmError> {
        let offset = self.offset();
        let got = self.u16(field)?;
        if got != want {
            return Err(self.unexpected(field, offset, got.into(), want.into()));
        }
        Ok(())
    }

    pub(crate) fn expect_u32(&mut self, field: &'static str, want: u32) -> Result<(), TpmError> {
        let offset = self.offset();
        let got = self.u32(field)?;
        if got != want {
            return Err(self.unexpected(field, offset, got.into(), want.into()));
        }
        Ok(())
    }

    pub(crate) fn unexpected(
        &self,
        field: &'static str,
        offset: usize,
        got: u64,
        want: u64,
    ) -> TpmError {
        TpmError::Unexpected {
            what: self.what,
            field,
            offset,
            got,
            want,
        }
    }

    pub(crate) fn invalid(&self, field: &'static str, offset: usize, why: String) -> TpmError {
        TpmError::Invalid {
            what: self.what,
            field,
            offset,
            why,
        }
    }

    /// Every structure we parse is the whole blob: bytes after it are an error, not ignored,
    /// because they would be signed (or hashed) without being checked.
    pub(crate) fn finish(self) -> Result<(), TpmError> {
        if self.remaining() != 0 {
            return Err(TpmError::Trailing {
                what: self.what,
                offset: self.offset(),
                count: self.remaining(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tpm_reader_reports_offsets() {
        let mut r = Reader::with_base("T", &[0, 1, 0, 0, 0, 2, 9], 100);
        assert_eq!(r.u16("a").unwrap(), 1);
        assert_eq!(r.u32("b").unwrap(), 2);
        let e = r.u16("c").unwrap_err();
        assert_eq!(e.to_string(), "T: c needs 2 bytes at byte 106, only 1 left");
        let mut r = Reader::new("T", &[0xff, 0x54, 0x43, 0x46, 7]);
        let e = r.expect_u32("magic", 0xff544347).unwrap_err();
        assert_eq!(
            e.to_string(),
            "T: magic 0xff544346 at byte 0, want 0xff544347"
        );
        assert_eq!(
            r.finish().unwrap_err().to_string(),
            "T: 1 trailing bytes at byte 4, want the structure to end there"
        );
    }
}
