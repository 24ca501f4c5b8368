//! The parsed selector and its evaluation.

use crate::value::{equals, ordered, Value};
use crate::{EvalError, Properties};
use std::fmt;

/// A literal of the selector.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Lit {
    Null,
    Bool(bool),
    Int(i32),
    Long(i64),
    Double(f64),
    Str(String),
}

/// `>`, `>=`, `<`, `<=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Gt,
    Ge,
    Lt,
    Le,
}

/// RocketMQ's string operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StrOp {
    Contains,
    StartsWith,
    EndsWith,
}

/// A selector expression. `<>` is `NOT (=)`, `IS NULL` is `= NULL` without the operand check,
/// `BETWEEN` is two comparisons under AND (`NOT BETWEEN`: the opposite ones under OR), as
/// RocketMQ builds them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    Lit(Lit),
    /// A message property by name.
    Prop(String),
    /// A property where a boolean is expected.
    BoolCast(String),
    Negate(Box<Expr>),
    Not(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Eq(Box<Expr>, Box<Expr>),
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
    /// `name [NOT] IN ('a', ...)`.
    In {
        name: String,
        list: Vec<String>,
        not: bool,
    },
    /// `operand [NOT] CONTAINS|STARTSWITH|ENDSWITH 'search'`.
    StrOp {
        op: StrOp,
        not: bool,
        operand: Box<Expr>,
        search: String,
    },
}

impl Expr {
    /// True for RocketMQ's `BooleanExpression`s (boolean constants and `NULL` included).
    pub(crate) fn is_boolean(&self) -> bool {
        match self {
            Expr::Lit(l) => matches!(l, Lit::Bool(_) | Lit::Null),
            Expr::Prop(_) | Expr::Negate(_) => false,
            _ => true,
        }
    }

    /// Evaluates the expression against a message's properties. Null is [`Value::Null`]; an
    /// error (a string that is not the number it is compared with) ends the evaluation.
    pub(crate) fn eval<'a>(
        &'a self,
        props: &'a (impl Properties + ?Sized),
    ) -> Result<Value<'a>, EvalError> {
        Ok(match self {
            Expr::Lit(l) => l.value(),
            Expr::Prop(name) => props.property(name).map_or(Value::Null, Value::Str),
            Expr::BoolCast(name) => match props.property(name) {
                None => Value::Null,
                // A property's value is a string, never a boolean.
                Some(_) => Value::Bool(false),
            },
            Expr::Negate(e) => match e.eval(props)? {
                Value::Int(i) => Value::Int(i.wrapping_neg()),
                Value::Long(l) => Value::Long(l.wrapping_neg()),
                Value::Double(d) => Value::Double(-d),
                _ => Value::Null,
            },
            Expr::Not(e) => match e.eval(props)?.as_bool() {
                None => Value::Null,
                Some(b) => Value::Bool(!b),
            },
            Expr::And(terms) => {
                let mut null = false;
                for t in terms {
                    match t.eval(props)?.as_bool() {
                        Some(false) => return Ok(Value::Bool(false)),
                        None => null = true,
                        Some(true) => {}
                    }
                }
                if null {
                    Value::Null
                } else {
                    Value::Bool(true)
                }
            }
            Expr::Or(terms) => {
                let mut null = false;
                for t in terms {
                    match t.eval(props)?.as_bool() {
                        Some(true) => return Ok(Value::Bool(true)),
                        None => null = true,
                        Some(false) => {}
                    }
                }
                if null {
                    Value::Null
                } else {
                    Value::Bool(false)
                }
            }
            Expr::Eq(l, r) => {
                let lv = l.eval(props)?;
                let rv = r.eval(props)?;
                equals(lv, rv)?
            }
            Expr::Cmp(op, l, r) => {
                let lv = l.eval(props)?;
                if lv == Value::Null {
                    return Ok(Value::Null);
                }
                let rv = r.eval(props)?;
                match ordered(lv, rv)? {
                    None => Value::Null,
                    Some(o) => Value::Bool(match op {
                        CmpOp::Gt => o.is_gt(),
                        CmpOp::Ge => o.is_ge(),
                        CmpOp::Lt => o.is_lt(),
                        CmpOp::Le => o.is_le(),
                    }),
                }
            }
            Expr::In { name, list, not } => match props.property(name) {
                None => Value::Null,
                Some(v) => Value::Bool(list.iter().any(|s| s == v) ^ not),
            },
            Expr::StrOp {
                op,
                not,
                operand,
                search,
            } => {
                if search.is_empty() {
                    return Ok(Value::Bool(false));
                }
                match operand.eval(props)? {
                    Value::Str(s) => {
                        let hit = match op {
                            StrOp::Contains => s.contains(search.as_str()),
                            StrOp::StartsWith => s.starts_with(search.as_str()),
                            StrOp::EndsWith => s.ends_with(search.as_str()),
                        };
                        Value::Bool(hit ^ not)
                    }
                    // Null and non-strings are false for the NOT forms too.
                    _ => Value::Bool(false),
                }
            }
        })
    }
}

fn quoted(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    write!(f, "'{}'", s.replace('\'', "''"))
}

impl fmt::Display for Lit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lit::Null => f.write_str("NULL"),
            Lit::Bool(true) => f.write_str("TRUE"),
            Lit::Bool(false) => f.write_str("FALSE"),
            Lit::Int(i) => write!(f, "{i}"),
            Lit::Long(l) => write!(f, "{l}"),
            Lit::Double(d) => write!(f, "{d:?}"),
            Lit::Str(s) => quoted(f, s),
        }
    }
}

fn joined(f: &mut fmt::Formatter<'_>, terms: &[Expr], sep: &str) -> fmt::Result {
    f.write_str("(")?;
    for (i, t) in terms.iter().enumerate() {
        if i > 0 {
            f.write_str(sep)?;
        }
        write!(f, "{t}")?;
    }
    f.write_str(")")
}

/// The expression in the grammar's syntax, fully parenthesized (parses back to itself).
impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Lit(l) => write!(f, "{l}"),
            Expr::Prop(n) | Expr::BoolCast(n) => f.write_str(n),
            Expr::Negate(e) => write!(f, "(-{e})"),
            Expr::Not(e) => write!(f, "(NOT {e})"),
            Expr::And(t) => joined(f, t, " AND "),
            Expr::Or(t) => joined(f, t, " OR "),
            Expr::Eq(l, r) if matches!(**r, Expr::Lit(Lit::Null)) => write!(f, "({l} IS NULL)"),
            Expr::Eq(l, r) => write!(f, "({l} = {r})"),
            Expr::Cmp(op, l, r) => {
                let s = match op {
                    CmpOp::Gt => ">",
                    CmpOp::Ge => ">=",
                    CmpOp::Lt => "<",
                    CmpOp::Le => "<=",
                };
                write!(f, "({l} {s} {r})")
            }
            Expr::In { name, list, not } => {
                write!(f, "({name} {}IN (", if *not { "NOT " } else { "" })?;
                for (i, s) in list.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    quoted(f, s)?;
                }
                f.write_str("))")
            }
            Expr::StrOp {
                op,
                not,
                operand,
                search,
            } => {
                let s = match op {
                    StrOp::Contains => "CONTAINS",
                    StrOp::StartsWith => "STARTSWITH",
                    StrOp::EndsWith => "ENDSWITH",
                };
                write!(f, "({operand} {}{s} ", if *not { "NOT " } else { "" })?;
                quoted(f, search)?;
                f.write_str(")")
            }
        }
    }
}
