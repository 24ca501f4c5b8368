//! Semantics tests: the cases of RocketMQ's filter module (`ExpressionTest`, `ParserTest`) and
//! its null and type rules, plus property tests of the parser.

use crate::{Selector, MAX_DEPTH};
use proptest::prelude::*;

fn sel(sql: &str) -> Selector {
    Selector::parse(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Evaluates `sql` over `props`: `Some(Some(b))`, `Some(None)` for null, `None` for an error.
fn eval(sql: &str, props: &[(&str, &str)]) -> Option<Option<bool>> {
    sel(sql).evaluate(props).ok()
}

fn is(sql: &str, props: &[(&str, &str)]) -> bool {
    sel(sql).matches(props)
}

#[test]
fn and_or_over_string_properties() {
    let and = "a=3 and b<>4 And c>5 AND d<=4";
    assert!(is(and, &[("a", "3"), ("b", "5"), ("c", "6"), ("d", "1")]));
    assert!(!is(and, &[("a", "4"), ("b", "5"), ("c", "6"), ("d", "1")]));
    let or = "a=3 or b<>4 Or c>5 OR d<=4";
    assert!(is(or, &[("a", "3")]));
    assert!(is(or, &[("a", "4"), ("b", "5")]));
    assert!(is(or, &[("a", "4"), ("b", "4"), ("c", "6")]));
    assert!(is(or, &[("a", "4"), ("b", "4"), ("c", "3"), ("d", "2")]));
    assert!(!is(or, &[("a", "4"), ("b", "4"), ("c", "3"), ("d", "10")]));
}

#[test]
fn in_and_not_in() {
    let inx = "a in ('3', '4', '5')";
    for v in ["3", "4", "5"] {
        assert!(is(inx, &[("a", v)]));
        assert!(!is("a not in ('3', '4', '5')", &[("a", v)]));
    }
    assert!(!is(inx, &[("a", "8")]));
    assert!(is("a not in ('3', '4', '5')", &[("a", "8")]));
    // Absent: null, so neither IN nor NOT IN matches.
    assert_eq!(eval(inx, &[]), Some(None));
    assert_eq!(eval("a NOT IN ('x')", &[]), Some(None));
}

#[test]
fn between_and_not_between() {
    let b = "a between 2 and 10";
    for v in ["2", "10", "3"] {
        assert!(is(b, &[("a", v)]));
        assert!(!is("a not between 2 and 10", &[("a", v)]));
    }
    for v in ["1", "11"] {
        assert!(!is(b, &[("a", v)]));
        assert!(is("a not between 2 and 10", &[("a", v)]));
    }
    assert_eq!(eval(b, &[]), Some(None));
    // Non-numeric values against numeric bounds are errors (no match).
    assert_eq!(eval("a between 0 and 100", &[("a", "abc")]), None);
    // Property bounds: both sides strings, compared as numbers.
    assert_eq!(
        eval(
            "a between lo and hi",
            &[("a", "3.14"), ("lo", "up"), ("hi", "low")]
        ),
        None
    );
    assert_eq!(eval("a between lo and hi", &[("a", "3.14")]), Some(None));
    assert!(is(
        "a between lo and hi",
        &[("a", "3.14"), ("lo", "3"), ("hi", "4")]
    ));
}

#[test]
fn null_rules() {
    assert!(is("a is null", &[("abc", "2")]));
    assert!(!is("a is null", &[("a", "2")]));
    assert!(is("a is not null", &[("a", "2")]));
    assert!(!is("a is not null", &[("abc", "2")]));
    let eq = "a is not null and a='hello'";
    assert!(is(eq, &[("a", "hello")]));
    assert!(!is(eq, &[]));
    let nor = "a is null OR a='hello'";
    assert!(is(nor, &[]));
    assert!(is(nor, &[("a", "hello")]));
    assert!(!is(nor, &[("a", "abc")]));
    // Three-valued logic.
    assert_eq!(eval("a = 'x'", &[]), Some(None));
    assert_eq!(eval("a = 'x' AND FALSE", &[]), Some(Some(false)));
    assert_eq!(eval("a = 'x' AND TRUE", &[]), Some(None));
    assert_eq!(eval("a = 'x' OR TRUE", &[]), Some(Some(true)));
    assert_eq!(eval("a = 'x' OR FALSE", &[]), Some(None));
    assert_eq!(eval("NOT (a = 'x')", &[]), Some(None));
    assert_eq!(eval("a <> 'x'", &[]), Some(None));
    assert_eq!(eval("a > 1", &[]), Some(None));
    // A property against a property that is absent.
    assert_eq!(eval("a = b", &[("a", "1")]), Some(Some(false)));
    assert_eq!(eval("b = a", &[("a", "1")]), Some(None));
}

#[test]
fn booleans_and_strings() {
    let b = "a=TRUE OR b=FALSE";
    assert!(is(b, &[("a", "true"), ("b", "false")]));
    assert!(!is(b, &[("a", "false"), ("b", "true")]));
    assert!(is("a = TRUE", &[("a", "TRUE")]));
    assert!(is("a = FALSE", &[("a", "anything")]));
    // Quotes doubled inside literals.
    assert!(is(
        "TAGS is not null and TAGS='''''tag'''''",
        &[("TAGS", "''tag''")]
    ));
    // A property alone is a boolean cast: a string is never TRUE.
    assert_eq!(eval("a", &[("a", "true")]), Some(Some(false)));
    assert_eq!(eval("a", &[]), Some(None));
    assert_eq!(eval("TRUE", &[]), Some(Some(true)));
    assert_eq!(eval("NULL", &[]), Some(None));
}

#[test]
fn numbers() {
    assert!(is("a > 3.1E10", &[("a", "3.1415E10")]));
    assert!(is("a > 3.14", &[("a", "3.1415")]));
    assert!(!is("a > b", &[("a", "10"), ("b", "20")]));
    assert!(is("a > b", &[("a", "20"), ("b", "10")]));
    assert!(is("a = b", &[("a", "3.14"), ("b", "3.14")]));
    assert!(!is("a <> b", &[("a", "3.14"), ("b", "3.14")]));
    assert!(is("a <> b", &[("a", "3.14"), ("b", "3.141")]));
    // A string against an integer literal is parsed as an integer: "10.5" is an error.
    assert!(is("a > 5", &[("a", "10")]));
    assert_eq!(eval("a > 5", &[("a", "10.5")]), None);
    assert!(is("a > 5.0", &[("a", "10.5")]));
    assert_eq!(eval("a = 5", &[("a", "five")]), None);
    assert_eq!(eval("a <> 5", &[("a", "five")]), None);
    // Large literals are longs; a value past 32 bits needs one.
    assert!(is("a > 3000000000", &[("a", "3000000001")]));
    assert_eq!(eval("a > 5", &[("a", "3000000001")]), None);
    assert!(is("a = 12L", &[("a", "12")]));
    // Unary minus on literals; on a property (a string) it is null.
    assert!(is("a > -5", &[("a", "-4")]));
    assert!(is("a < -(-5)", &[("a", "4")]));
    assert_eq!(eval("-a = -1", &[("a", "1")]), Some(None));
    assert!(is("+a = 1", &[("a", "1")]));
    // Strings are ordered only as numbers.
    assert_eq!(eval("a > b", &[("a", "x"), ("b", "y")]), None);
}

#[test]
fn string_operators() {
    let p = [("a", "hello world")];
    assert!(is("a CONTAINS 'lo w'", &p));
    assert!(is("a STARTSWITH 'hell'", &p));
    assert!(is("a ENDSWITH 'world'", &p));
    assert!(!is("a NOT CONTAINS 'lo w'", &p));
    assert!(is("a not startswith 'world'", &p));
    assert!(!is("a NOT ENDSWITH 'world'", &p));
    // An empty search never matches, nor does an absent property, in both forms.
    assert_eq!(eval("a CONTAINS ''", &p), Some(Some(false)));
    assert_eq!(eval("a NOT CONTAINS ''", &p), Some(Some(false)));
    assert_eq!(eval("b CONTAINS 'x'", &p), Some(Some(false)));
    assert_eq!(eval("b NOT CONTAINS 'x'", &p), Some(Some(false)));
    // A non-string operand is false.
    assert_eq!(eval("5 NOT CONTAINS 'x'", &p), Some(Some(false)));
    assert!(is("a contains 'o' and a endswith 'd'", &p));
}

#[test]
fn comments_case_and_whitespace() {
    assert!(is(
        "/* who */ region\t=\r\n'eu' -- the region\n AnD amount BETWEEN 1 AND 9",
        &[("region", "eu"), ("amount", "5")]
    ));
    assert!(is("$a_1 = 'x'", &[("$a_1", "x")]));
    // Names keep their case: `A` is not `a`.
    assert!(!is("A = 'x'", &[("a", "x")]));
}

#[test]
fn refused_at_parse_time() {
    for bad in [
        "",
        "a =",
        "a = NULL",
        "NULL = a",
        "TRUE = 1",
        "a > 'x'",
        "a > TRUE",
        "'x' < a",
        "a > NULL",
        "(a > 1) > 2",
        "NOT a > 5",
        "NOT 5",
        "5",
        "'text'",
        "a AND 5",
        "a BETWEEN 10 AND 2",
        "a BETWEEN NULL AND 2",
        "a BETWEEN 'a' AND 'b'",
        "'x' IN ('x')",
        "a IN ()",
        "a IN (1, 2)",
        "a CONTAINS 5",
        "a CONTAINS b",
        "a > 0.0",
        "a > 1e400",
        "a > 99999999999999999999",
        "a == 1",
        "a != 1",
        "a LIKE 'x%'",
        "a = 1 + 1",
        "a = 007",
        "a = 0L",
        "(a = 1",
        "a = 1)",
        "a IS 5",
        "a.b = 1",
        "a = 'open",
        "a = 1 -- comment without a line break",
        "a = 1 /* open",
    ] {
        let r = Selector::parse(bad);
        assert!(r.is_err(), "{bad:?} parsed as {}", r.unwrap());
    }
    // What RocketMQ accepts among look-alikes.
    for good in [
        "1 = TRUE",
        "a = TRUE",
        "TRUE",
        "NULL",
        "a IS NULL IS NULL",
        "a BETWEEN -1 AND 5",
        "a NOT BETWEEN 10 AND 2",
        "a > 0",
        "a > .5",
        "a > 5.",
        "a > 5E3",
        "a = 1 = TRUE",
        "a = 1 > 2",
        "NOT (a > 5)",
        "NOT a",
        "a OR b",
    ] {
        assert!(Selector::parse(good).is_ok(), "{good:?} was refused");
    }
}

#[test]
fn errors_say_where() {
    let e = Selector::parse("a = 1 AND b >").unwrap_err();
    assert_eq!(e.at, 13);
    assert!(e.to_string().contains("byte 13"), "{e}");
    let e = Selector::parse("a = NULL").unwrap_err();
    assert!(e.reason.contains("IS NULL"), "{e}");
}

#[test]
fn nesting_is_bounded() {
    let ok = format!(
        "{}a = 1{}",
        "(".repeat(MAX_DEPTH - 2),
        ")".repeat(MAX_DEPTH - 2)
    );
    assert!(Selector::parse(&ok).is_ok());
    let deep = format!("{}a = 1{}", "(".repeat(100_000), ")".repeat(100_000));
    assert!(Selector::parse(&deep)
        .unwrap_err()
        .reason
        .contains("nested"));
    let nots = format!("{}a", "NOT ".repeat(100_000));
    assert!(Selector::parse(&nots).is_err());
    let chain = format!("a{}", " IS NULL".repeat(100_000));
    assert!(Selector::parse(&chain).is_err());
    // Long AND/OR lists are flat: no depth.
    let wide = vec!["a = '1'"; 10_000].join(" OR ");
    assert!(sel(&wide).matches(&[("a", "1")][..]));
}

fn ident() -> impl Strategy<Value = String> {
    "[a-z_$][a-z0-9_$]{0,6}".prop_filter("not a keyword", |s| {
        ![
            "not",
            "and",
            "or",
            "between",
            "in",
            "true",
            "false",
            "null",
            "is",
            "contains",
            "startswith",
            "endswith",
        ]
        .contains(&s.as_str())
    })
}

fn atom() -> impl Strategy<Value = String> {
    let name = ident();
    prop_oneof![
        (ident(), 0i64..1_000).prop_map(|(n, v)| format!("{n} > {v}")),
        (ident(), "[a-z' ]{0,5}").prop_map(|(n, v)| format!("{n} = '{}'", v.replace('\'', "''"))),
        name.prop_map(|n| format!("{n} IS NOT NULL")),
        (ident(), "[a-z]{1,3}").prop_map(|(n, v)| format!("{n} CONTAINS '{v}'")),
        (ident(), 0i32..5, 5i32..10).prop_map(|(n, a, b)| format!("{n} NOT BETWEEN {a} AND {b}")),
        (ident(), "[a-z]{1,3}").prop_map(|(n, v)| format!("{n} IN ('{v}', 'x')")),
    ]
}

fn selector() -> impl Strategy<Value = String> {
    atom().prop_recursive(4, 24, 3, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a}) AND ({b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a}) OR ({b})")),
            inner.prop_map(|a| format!("NOT ({a})")),
        ]
    })
}

proptest! {
    /// The parser never panics, whatever it is given.
    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,64}") {
        let _ = Selector::parse(&s);
    }

    /// The printed form parses back to the same expression.
    #[test]
    fn display_parses_back(s in selector()) {
        let a = sel(&s);
        let b = sel(&a.to_string());
        prop_assert_eq!(a.to_string(), b.to_string());
    }

    /// NOT flips true and false and keeps null; `x OR NOT x` is never false.
    #[test]
    fn negation_is_three_valued(s in selector(), a in "[0-9]{1,2}", b in "[a-z]{0,2}") {
        let props = [("a", a.as_str()), ("b", b.as_str()), ("ab", "x")];
        let p = sel(&s).evaluate(&props[..]);
        let n = sel(&format!("NOT ({s})")).evaluate(&props[..]);
        match (p, n) {
            (Ok(x), Ok(y)) => prop_assert_eq!(x.map(|v| !v), y),
            (Err(_), Err(_)) => {}
            (x, y) => prop_assert!(false, "{:?} vs {:?}", x, y),
        }
        let either = sel(&format!("({s}) OR NOT ({s})")).evaluate(&props[..]);
        prop_assert_ne!(either, Ok(Some(false)));
    }
}
