//! Walking protobuf messages without decoding them: their fields in order, borrowed from the
//! bytes, each with its whole encoded extent (key, length and value) so that a field can be
//! copied as it is.
//!
//! The walker knows the wire format, not the schema: what a field number means is the caller's
//! business. Every malformed input (a truncated varint, a length past the end, an unknown wire
//! type, field number 0) is an [`Error::Decode`], never a panic.

use super::super::lister_watcher::Error;

/// A protobuf field's value, borrowed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 2: strings, bytes, nested messages, packed repeated fields.
    Bytes(&'a [u8]),
    /// Wire types 1 and 5 (64- and 32-bit), skipped.
    Fixed,
}

/// One field: its number, its value, and all its bytes (key, length, value).
#[derive(Debug)]
pub(crate) struct Field<'a> {
    /// The field number.
    pub(crate) number: u32,
    /// The value.
    pub(crate) value: Value<'a>,
    /// The field as encoded, from its key to its value's last byte.
    pub(crate) encoded: &'a [u8],
}

/// The fields of a protobuf message, in order, borrowed from its bytes.
pub(crate) struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    /// The next field with its extent; `None` at the end of the message.
    pub(crate) fn next_field(&mut self) -> Option<Result<Field<'a>, Error>> {
        if self.rest.is_empty() {
            return None;
        }
        let start = self.rest;
        let step = self.step();
        Some(match step {
            Ok((number, value)) => {
                let used = start.len() - self.rest.len();
                Ok(Field {
                    number,
                    value,
                    encoded: &start[..used],
                })
            }
            Err(e) => {
                // One error, then the end.
                self.rest = &[];
                Err(e)
            }
        })
    }

    fn step(&mut self) -> Result<(u32, Value<'a>), Error> {
        let malformed = |what: &str| Error::Decode(format!("malformed protobuf: {what}"));
        let key =
            prost::encoding::decode_varint(&mut self.rest).map_err(|_| malformed("a field key"))?;
        let field = u32::try_from(key >> 3).map_err(|_| malformed("a field number"))?;
        let value = match key & 7 {
            0 => Value::Varint(
                prost::encoding::decode_varint(&mut self.rest)
                    .map_err(|_| malformed("a varint"))?,
            ),
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                if self.rest.len() < n {
                    return Err(malformed("a fixed-size field cut short"));
                }
                self.rest = &self.rest[n..];
                Value::Fixed
            }
            2 => {
                let len = prost::encoding::decode_varint(&mut self.rest)
                    .map_err(|_| malformed("a length"))?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&l| l <= self.rest.len())
                    .ok_or_else(|| malformed("a length past the end of the message"))?;
                let (bytes, rest) = self.rest.split_at(len);
                self.rest = rest;
                Value::Bytes(bytes)
            }
            _ => return Err(malformed("an unsupported wire type")),
        };
        if field == 0 {
            return Err(malformed("field number 0"));
        }
        Ok((field, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_field()
            .map(|field| field.map(|f| (f.number, f.value)))
    }
}

/// Appends a base-128 varint, as protobuf writes integers and lengths.
pub(crate) fn push_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// How many bytes [`push_varint`] writes for `n`.
pub(crate) fn varint_len(n: u64) -> usize {
    // One byte per started 7 bits, at least one.
    (64 - (n | 1).leading_zeros() as usize).div_ceil(7)
}

/// Appends a length-delimited field's key and length (its bytes follow).
pub(crate) fn push_len_field_head(out: &mut Vec<u8>, number: u32, len: usize) {
    push_varint(out, u64::from(number) << 3 | 2);
    push_varint(out, len as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_extent_covers_its_key_length_and_value() {
        // field 1 "ab", field 2 varint 300, field 3 fixed32.
        let bytes = [0x0a, 2, b'a', b'b', 0x10, 0xac, 0x02, 0x1d, 1, 2, 3, 4];
        let mut fields = Fields::new(&bytes);
        let a = fields.next_field().unwrap().unwrap();
        assert_eq!((a.number, a.encoded), (1, &bytes[..4]));
        assert_eq!(a.value, Value::Bytes(b"ab"));
        let b = fields.next_field().unwrap().unwrap();
        assert_eq!(
            (b.number, b.value, b.encoded),
            (2, Value::Varint(300), &bytes[4..7])
        );
        let c = fields.next_field().unwrap().unwrap();
        assert_eq!((c.number, c.encoded), (3, &bytes[7..]));
        assert!(fields.next_field().is_none());
    }

    #[test]
    fn malformed_input_is_one_error_then_the_end() {
        let mut fields = Fields::new(&[0x0a, 9, b'a']);
        assert!(fields.next_field().unwrap().is_err());
        assert!(fields.next_field().is_none());
        assert!(Fields::new(&[0x07]).next().unwrap().is_err(), "wire type 7");
        assert!(Fields::new(&[0x00, 1]).next().unwrap().is_err(), "field 0");
    }

    #[test]
    fn varint_lengths() {
        for n in [0, 1, 127, 128, 16_383, 16_384, u64::MAX >> 1, u64::MAX] {
            let mut out = Vec::new();
            push_varint(&mut out, n);
            assert_eq!(out.len(), varint_len(n), "{n}");
        }
    }
}
