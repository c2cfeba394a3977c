//! Writing JSON and protobuf by hand: the few primitives the pod templates and the wire
//! format are made of (strings, integers, RFC 3339 times; protobuf keys, varints and
//! length-delimited fields). The lowest layer of `serve`'s encoding: it knows no pod.

/// `s` as a JSON string: copied as it is when nothing in it needs escaping (the workload's
/// names never do), through serde_json otherwise.
pub fn push_json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, s).expect("writing a string into a Vec cannot fail");
    }
}

/// `n` in decimal.
pub fn push_u64(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a second in 0001..=9999 (Howard Hinnant's `civil_from_days`).
pub fn push_rfc3339(out: &mut Vec<u8>, second: i64) {
    let days = second.div_euclid(86_400);
    let of_day = second.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let two = |out: &mut Vec<u8>, n: i64| {
        out.push(b'0' + (n / 10) as u8);
        out.push(b'0' + (n % 10) as u8);
    };
    two(out, year / 100);
    two(out, year % 100);
    out.push(b'-');
    two(out, month);
    out.push(b'-');
    two(out, day);
    out.push(b'T');
    two(out, of_day / 3_600);
    out.push(b':');
    two(out, of_day / 60 % 60);
    out.push(b':');
    two(out, of_day % 60);
    out.push(b'Z');
}

/// Protobuf wire type of a varint field.
pub const VARINT: u8 = 0;
/// Protobuf wire type of a length-delimited field (strings, bytes, messages).
pub const LEN: u8 = 2;

/// A field's key: its number and wire type.
pub fn key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, u64::from(field) << 3 | u64::from(wire_type));
}

/// A base-128 varint, as protobuf writes integers and lengths.
pub fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// How many bytes [`varint`] writes for `n`.
pub fn varint_len(n: u64) -> usize {
    // 1 byte per started 7 bits, at least one.
    (64 - (n | 1).leading_zeros() as usize).div_ceil(7)
}

/// A length-delimited field.
pub fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(out, field, LEN);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A string field.
pub fn string_field(out: &mut Vec<u8>, field: u32, s: &str) {
    bytes_field(out, field, s.as_bytes());
}
