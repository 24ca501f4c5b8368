//! Hash functions the strategies rely on; all are pure integer (or IEEE basic) arithmetic so
//! every client computes the same bits.

use md5::{Digest, Md5};
use shoal_proto::mq::MessageQueue;

/// RocketMQ's consistent-hash ring function (`ConsistentHashRouter.MD5Hash`): the MD5 digest
/// of the key's UTF-8 bytes, its first four bytes read big-endian as an unsigned 32-bit
/// number (returned in a Java `long`, so never negative).
pub fn java_md5_hash(key: &str) -> i64 {
    let digest = Md5::digest(key.as_bytes());
    let mut h: i64 = 0;
    for b in digest.iter().take(4) {
        h = (h << 8) | i64::from(*b);
    }
    h
}

/// Java's `MessageQueue.toString()`: `MessageQueue [topic=T, brokerName=b, queueId=0]`, the
/// key RocketMQ hashes onto the consistent-hash ring.
pub fn java_message_queue_string(mq: &MessageQueue) -> String {
    format!(
        "MessageQueue [topic={}, brokerName={}, queueId={}]",
        mq.topic, mq.broker_name, mq.queue_id
    )
}

/// 64-bit FNV-1a of `bytes`.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64 finaliser: a bijective 64-bit mixer.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Natural logarithm of a positive finite `x`, computed with IEEE-754 basic operations only
/// (no platform `libm`), so that every machine gets the same bits. Accurate to ~1e-12.
pub(crate) fn det_ln(x: f64) -> f64 {
    // x = 2^e * m with m in [1, 2) from the bit pattern (x is normal here: callers pass
    // values in (2^-54, 2^64)).
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    // ln m = 2 atanh(s), s = (m - 1) / (m + 1) in [0, 1/3).
    // Centre m on 1: m in [√½, √2) so that |s| < 0.172 and 10 terms reach 1e-16.
    let (m, exp) = if m > std::f64::consts::SQRT_2 {
        (m * 0.5, exp + 1)
    } else {
        (m, exp)
    };
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    // 2·atanh(s) = 2·(s + s³/3 + s⁵/5 + …), Horner form.
    const INV_ODD: [f64; 10] = [
        1.0,
        1.0 / 3.0,
        1.0 / 5.0,
        1.0 / 7.0,
        1.0 / 9.0,
        1.0 / 11.0,
        1.0 / 13.0,
        1.0 / 15.0,
        1.0 / 17.0,
        1.0 / 19.0,
    ];
    let mut poly = 0.0;
    for c in INV_ODD.iter().rev() {
        poly = poly * s2 + c;
    }
    const LN2: f64 = std::f64::consts::LN_2;
    exp as f64 * LN2 + 2.0 * s * poly
}

/// A standard Gumbel variate `-ln(-ln u)` from 64 random bits, `u` uniform in (0, 1).
pub(crate) fn gumbel(bits: u64) -> f64 {
    let u = ((bits >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -det_ln(-det_ln(u))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_hash_reads_first_four_bytes() {
        // MD5("") = d41d8cd9 8f00b204 e9800998 ecf8427e
        assert_eq!(java_md5_hash(""), 0xd41d8cd9);
        // MD5("abc") = 90015098 3cd24fb0 d6963f7d 28e17f72
        assert_eq!(java_md5_hash("abc"), 0x90015098);
    }

    #[test]
    fn message_queue_string_is_java_to_string() {
        assert_eq!(
            java_message_queue_string(&MessageQueue::new("T", "broker-a", 3)),
            "MessageQueue [topic=T, brokerName=broker-a, queueId=3]"
        );
    }

    #[test]
    fn deterministic_ln_is_accurate() {
        for &x in &[
            1e-16, 1e-9, 0.001, 0.3, 0.5, 0.999_999, 1.0, 1.5, 2.0, 7.0, 1e6, 1e18,
        ] {
            let d = det_ln(x) - x.ln();
            assert!(
                d.abs() < 1e-11 * x.ln().abs().max(1.0),
                "ln({x}) off by {d}"
            );
        }
        let g = gumbel(0);
        assert!(g.is_finite());
        assert!(gumbel(u64::MAX).is_finite());
        assert!(gumbel(u64::MAX) > gumbel(1 << 63));
    }

    #[test]
    fn fnv_and_mix() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(mix64(1), mix64(2));
    }
}
