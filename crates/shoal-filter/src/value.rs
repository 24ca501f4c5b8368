//! Values of an evaluation and RocketMQ's comparison rules (its `ComparisonExpression`, with
//! string conversion on, as its parser always sets it).
//!
//! Literals are `Int` (a decimal that fits 32 bits), `Long`, `Double`, `Str`, `Bool` or null;
//! message properties are always strings. Two values of different kinds are converted before
//! they are compared: a number and a string compare as numbers of the number's kind (the
//! string parsed as Java's `Integer`/`Long`/`Double.valueOf` would; a string that does not
//! parse is an error, and an error makes the selector not match), a string and a boolean as
//! booleans (`"true"` in any case is true), and numbers widen (int to long to double). Other
//! mixes compare as "less" (Java's `-1`), so `=` is false for them.

use crate::EvalError;
use std::cmp::Ordering;

/// A value during evaluation. Strings borrow from the selector or from the message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    /// SQL null: an absent property, or `NULL`.
    Null,
    /// `TRUE` / `FALSE`, or a boolean expression's result.
    Bool(bool),
    /// A decimal literal that fits 32 bits.
    Int(i32),
    /// A decimal literal that does not fit 32 bits.
    Long(i64),
    /// A floating-point literal.
    Double(f64),
    /// A string literal or a property's value.
    Str(&'a str),
}

impl Value<'_> {
    /// The value as a nullable boolean (what a boolean expression yields).
    pub(crate) fn as_bool(self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    fn same_kind(&self, other: &Value<'_>) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// Java's `Double.compare`: NaN equals NaN and is above everything, -0.0 is below 0.0.
pub(crate) fn java_double_cmp(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a
            .partial_cmp(&b)
            .unwrap_or(Ordering::Equal)
            .then_with(|| b.is_sign_negative().cmp(&a.is_sign_negative())),
    }
}

/// Java's `Integer.valueOf(String)`.
pub(crate) fn parse_int(s: &str) -> Result<i32, EvalError> {
    s.parse::<i32>().map_err(|_| EvalError::not_a_number(s))
}

/// Java's `Long.valueOf(String)`.
pub(crate) fn parse_long(s: &str) -> Result<i64, EvalError> {
    s.parse::<i64>().map_err(|_| EvalError::not_a_number(s))
}

/// Java's `Double.valueOf(String)`: surrounding whitespace (anything up to a space) ignored,
/// an optional sign, `NaN`, `Infinity`, or a decimal with an optional exponent and an optional
/// `f`/`F`/`d`/`D` suffix.
pub(crate) fn parse_double(s: &str) -> Result<f64, EvalError> {
    let t = s.trim_matches(|c: char| c <= ' ');
    let unsigned = t.strip_prefix(['+', '-']).unwrap_or(t);
    let negative = t.starts_with('-');
    match unsigned {
        "NaN" => return Ok(f64::NAN),
        "Infinity" => {
            return Ok(if negative {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            })
        }
        _ => {}
    }
    let body = t
        .strip_suffix(['f', 'F', 'd', 'D'])
        .filter(|b| !b.is_empty())
        .unwrap_or(t);
    let plain = body
        .bytes()
        .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-'));
    if !plain || !body.bytes().any(|c| c.is_ascii_digit()) {
        return Err(EvalError::not_a_number(s));
    }
    body.parse::<f64>().map_err(|_| EvalError::not_a_number(s))
}

fn java_bool(s: &str) -> bool {
    s.eq_ignore_ascii_case("true")
}

fn bool_cmp(a: bool, b: bool) -> Ordering {
    a.cmp(&b)
}

/// Java's `Comparable.compareTo` after RocketMQ's conversions (`ComparisonExpression
/// .__compare` with string conversion on). `Less` stands for the `-1` that kinds which cannot
/// be compared give.
pub(crate) fn compare(lv: Value<'_>, rv: Value<'_>) -> Result<Ordering, EvalError> {
    use Value::*;
    Ok(match (lv, rv) {
        (Bool(a), Bool(b)) => bool_cmp(a, b),
        (Int(a), Int(b)) => a.cmp(&b),
        (Long(a), Long(b)) => a.cmp(&b),
        (Double(a), Double(b)) => java_double_cmp(a, b),
        (Str(a), Str(b)) => java_str_cmp(a, b),
        // Java casts the boolean to a string here and fails.
        (Bool(_), Str(s)) => {
            return Err(EvalError::new(format!(
                "cannot compare TRUE/FALSE with '{s}'"
            )))
        }
        (Int(a), Long(b)) => i64::from(a).cmp(&b),
        (Int(a), Double(b)) => java_double_cmp(f64::from(a), b),
        (Double(a), Int(b)) => java_double_cmp(a, f64::from(b)),
        (Int(a), Str(s)) => a.cmp(&parse_int(s)?),
        (Long(a), Int(b)) => a.cmp(&i64::from(b)),
        (Long(a), Double(b)) => java_double_cmp(a as f64, b),
        (Long(a), Str(s)) => a.cmp(&parse_long(s)?),
        (Double(a), Long(b)) => java_double_cmp(a, b as f64),
        (Double(a), Str(s)) => java_double_cmp(a, parse_double(s)?),
        (Str(s), Bool(b)) => bool_cmp(java_bool(s), b),
        (Str(s), Int(b)) => parse_int(s)?.cmp(&b),
        (Str(s), Long(b)) => parse_long(s)?.cmp(&b),
        (Str(s), Double(b)) => java_double_cmp(parse_double(s)?, b),
        _ => Ordering::Less,
    })
}

/// Java's `String.compareTo`: UTF-16 code units in order.
fn java_str_cmp(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// `=` as RocketMQ evaluates it: null against null is true, a null left side is null, a null
/// right side is false; equal values of one kind are true; otherwise the converted comparison.
pub(crate) fn equals(lv: Value<'_>, rv: Value<'_>) -> Result<Value<'static>, EvalError> {
    Ok(match (lv, rv) {
        (Value::Null, Value::Null) => Value::Bool(true),
        (Value::Null, _) => Value::Null,
        (_, Value::Null) => Value::Bool(false),
        (Value::Double(a), Value::Double(b)) => Value::Bool(java_double_cmp(a, b).is_eq()),
        (l, r) if l.same_kind(&r) && l == r => Value::Bool(true),
        (l, r) => Value::Bool(compare(l, r)?.is_eq()),
    })
}

/// `>`, `>=`, `<`, `<=`: null if either side is null; two strings compare as doubles (an error
/// when either is not a number).
pub(crate) fn ordered(lv: Value<'_>, rv: Value<'_>) -> Result<Option<Ordering>, EvalError> {
    match (lv, rv) {
        (Value::Null, _) | (_, Value::Null) => Ok(None),
        (Value::Str(a), Value::Str(b)) => {
            let (a, b) = match (parse_double(a), parse_double(b)) {
                (Ok(a), Ok(b)) => (a, b),
                _ => {
                    return Err(EvalError::new(format!(
                        "it's illegal to compare strings by '>=', '>', '<', '<=': '{a}', '{b}'"
                    )))
                }
            };
            Ok(Some(java_double_cmp(a, b)))
        }
        (l, r) => compare(l, r).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Value::*;

    #[test]
    fn java_double_order() {
        assert_eq!(java_double_cmp(f64::NAN, f64::INFINITY), Ordering::Greater);
        assert_eq!(java_double_cmp(f64::NAN, f64::NAN), Ordering::Equal);
        assert_eq!(java_double_cmp(-0.0, 0.0), Ordering::Less);
        assert_eq!(java_double_cmp(1.0, 2.0), Ordering::Less);
    }

    #[test]
    fn java_number_parsing() {
        assert_eq!(parse_int("+12").unwrap(), 12);
        assert!(parse_int(" 12").is_err());
        assert!(parse_int("1.5").is_err());
        assert!(parse_int("2147483648").is_err());
        assert_eq!(parse_long("2147483648").unwrap(), 2_147_483_648);
        assert_eq!(parse_double(" 1.5 ").unwrap(), 1.5);
        assert_eq!(parse_double("2f").unwrap(), 2.0);
        assert_eq!(parse_double("-Infinity").unwrap(), f64::NEG_INFINITY);
        assert!(parse_double("NaN").unwrap().is_nan());
        assert!(parse_double("inf").is_err());
        assert!(parse_double("nan").is_err());
        assert!(parse_double("abc").is_err());
        assert!(parse_double("").is_err());
        assert!(parse_double("d").is_err());
    }

    #[test]
    fn conversions() {
        assert_eq!(compare(Str("10"), Int(5)).unwrap(), Ordering::Greater);
        assert_eq!(compare(Int(5), Str("10")).unwrap(), Ordering::Less);
        assert!(compare(Str("10.5"), Int(5)).is_err());
        assert_eq!(
            compare(Str("10.5"), Double(5.0)).unwrap(),
            Ordering::Greater
        );
        assert_eq!(compare(Int(1), Long(1)).unwrap(), Ordering::Equal);
        assert_eq!(compare(Long(3), Double(2.5)).unwrap(), Ordering::Greater);
        assert_eq!(compare(Double(2.5), Int(3)).unwrap(), Ordering::Less);
        assert_eq!(compare(Str("TRUE"), Bool(true)).unwrap(), Ordering::Equal);
        assert!(compare(Bool(true), Str("true")).is_err());
        assert_eq!(compare(Bool(true), Int(1)).unwrap(), Ordering::Less);
        assert_eq!(compare(Int(1), Bool(true)).unwrap(), Ordering::Less);
    }

    #[test]
    fn equality_and_nulls() {
        assert_eq!(equals(Null, Null).unwrap(), Bool(true));
        assert_eq!(equals(Null, Int(1)).unwrap(), Null);
        assert_eq!(equals(Int(1), Null).unwrap(), Bool(false));
        assert_eq!(equals(Str("a"), Str("a")).unwrap(), Bool(true));
        assert_eq!(equals(Str("a"), Str("b")).unwrap(), Bool(false));
        assert_eq!(equals(Str("3"), Int(3)).unwrap(), Bool(true));
        assert!(equals(Str("x"), Int(3)).is_err());
        assert_eq!(equals(Int(1), Double(1.0)).unwrap(), Bool(true));
        assert_eq!(equals(Double(0.0), Double(-0.0)).unwrap(), Bool(false));
        assert_eq!(ordered(Null, Int(1)).unwrap(), None);
        assert_eq!(ordered(Str("2"), Str("10")).unwrap(), Some(Ordering::Less));
        assert!(ordered(Str("a"), Str("b")).is_err());
    }
}
