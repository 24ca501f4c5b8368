//! Java `String.hashCode`, used for tag codes (spec section 5.3).

/// Java's `String.hashCode()`: `h = 31 * h + c` over the string's **UTF-16 code units**, with
/// 32-bit wrapping signed arithmetic. The empty string hashes to 0.
///
/// Characters outside the Basic Multilingual Plane count as two code units (a surrogate pair),
/// exactly as in Java.
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    })
}

/// The tag code of a message, as stored in a consume-queue entry: the Java hash of its `TAGS`
/// property sign-extended to 64 bits, 0 when the message has no (or an empty) tag.
pub fn tags_code(tags: Option<&str>) -> i64 {
    match tags {
        Some(t) if !t.is_empty() => i64::from(java_string_hash(t)),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn spec_vectors() {
        assert_eq!(java_string_hash("tagA"), 3552231);
        assert_eq!(java_string_hash("tagB"), 3552232);
        assert_eq!(java_string_hash("TagA"), 2598919);
        assert_eq!(java_string_hash("*"), 42);
        assert_eq!(java_string_hash("order-created"), -392709271);
        assert_eq!(java_string_hash("标签"), 857175);
        assert_eq!(java_string_hash("a😀"), 1866116);
        assert_eq!(java_string_hash("%RETRY%CG"), -1978267930);
        assert_eq!(java_string_hash(""), 0);
    }

    #[test]
    fn tags_code_sign_extends_and_defaults_to_zero() {
        assert_eq!(tags_code(None), 0);
        assert_eq!(tags_code(Some("")), 0);
        assert_eq!(tags_code(Some("tagA")), 3552231);
        assert_eq!(tags_code(Some("order-created")), -392709271i64);
    }

    proptest! {
        /// The fold equals the textbook definition `sum(c[i] * 31^(n-1-i))` mod 2^32.
        #[test]
        fn matches_polynomial_definition(s in "\\PC{0,24}") {
            let units: Vec<u16> = s.encode_utf16().collect();
            let n = units.len();
            let mut expected = 0u32;
            for (i, u) in units.iter().enumerate() {
                let mut p = 1u32;
                for _ in 0..(n - 1 - i) {
                    p = p.wrapping_mul(31);
                }
                expected = expected.wrapping_add(u32::from(*u).wrapping_mul(p));
            }
            prop_assert_eq!(java_string_hash(&s), expected as i32);
        }
    }
}
