//! `shoal-filter`: RocketMQ's SQL92 message selectors, parsed and evaluated with no I/O.
//!
//! The grammar is RocketMQ's (`filter/.../SelectorParser.jj`, a JMS-selector subset):
//! `AND`, `OR`, `NOT`, `=`, `<>`, `>`, `>=`, `<`, `<=`, `[NOT] BETWEEN x AND y`,
//! `[NOT] IN ('a', ...)` (strings only), `IS [NOT] NULL`, `[NOT] CONTAINS|STARTSWITH|ENDSWITH
//! 'text'`, unary `+`/`-`, literals (`12`, `12L`, `1.5`, `.5`, `5E3`, `'text'` with `''` for a
//! quote, `TRUE`, `FALSE`, `NULL`), property names `[a-zA-Z_$][a-zA-Z0-9_$]*`, `--` and `/* */`
//! comments; keywords in any case; no arithmetic, no `LIKE`.
//!
//! Evaluation follows RocketMQ's rules ([`value`] has the conversions):
//! - message properties are strings; a property that is absent is null;
//! - a comparison with null is null, and a selector whose result is null (or an error) does
//!   not match;
//! - `AND`/`OR` are three-valued (`FALSE AND NULL` is false, `TRUE OR NULL` is true);
//! - `>`/`<` between two strings compares them as numbers (an error if either is not one);
//!   a string against a number literal is parsed as that literal's kind (`'10' > 5` is true,
//!   `'10.5' > 5` is an error, `'10.5' > 5.0` is true);
//! - `IN` and the string operators need a string; `x NOT IN (...)` and `x NOT CONTAINS 'a'`
//!   are false (not true) when `x` is absent.
//!
//! Some expressions are refused when parsed, as RocketMQ refuses them: `NULL` compared with
//! `=`, a boolean or string literal with `>`, `BETWEEN` with null or reversed literal bounds,
//! `IN` on anything but a property, a literal alone where a boolean is needed, and float
//! literals that are zero (`0.0`; write `0`).
//!
//! ```
//! use shoal_filter::Selector;
//! use std::collections::HashMap;
//!
//! let s = Selector::parse("region = 'eu' AND amount > 100").unwrap();
//! let mut props = HashMap::new();
//! props.insert("region".to_string(), "eu".to_string());
//! props.insert("amount".to_string(), "250".to_string());
//! assert!(s.matches(&props));
//! props.remove("amount");
//! assert!(!s.matches(&props)); // null is not a match
//! assert!(Selector::parse("amount >").is_err());
//! ```

#![warn(missing_docs)]

mod ast;
mod lexer;
mod parser;
mod properties;
pub mod value;

#[cfg(test)]
mod tests;

pub use properties::{Properties, RawProperties};
pub use value::Value;

use std::fmt;

/// Deepest nesting a selector may have (parentheses, unary operators, operator chains): a
/// client cannot make the broker recurse without bound.
pub const MAX_DEPTH: usize = 64;

/// A selector that does not parse, or that RocketMQ would refuse to compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid SQL92 selector at byte {at}: {reason}")]
pub struct ParseError {
    /// Byte offset in the selector where the problem was found.
    pub at: usize,
    /// What is wrong.
    pub reason: String,
}

impl ParseError {
    pub(crate) fn at(at: usize, reason: impl Into<String>) -> Self {
        Self {
            at,
            reason: reason.into(),
        }
    }
}

/// An evaluation that failed (a property compared with a number it is not): the selector does
/// not match that message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EvalError(String);

impl EvalError {
    pub(crate) fn new(reason: String) -> Self {
        Self(reason)
    }

    pub(crate) fn not_a_number(s: &str) -> Self {
        Self(format!(
            "'{s}' is not a number of the kind it is compared with"
        ))
    }
}

/// A compiled SQL92 selector.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    source: String,
    expr: ast::Expr,
}

impl Selector {
    /// Parses and checks a selector.
    ///
    /// # Errors
    /// [`ParseError`] for a syntax error, an expression RocketMQ refuses to compile, or one
    /// nested deeper than [`MAX_DEPTH`].
    pub fn parse(sql: &str) -> Result<Self, ParseError> {
        let expr = parser::parse(sql)?;
        Ok(Self {
            source: sql.to_owned(),
            expr,
        })
    }

    /// The selector as it was given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Evaluates the selector: `Some(true)`, `Some(false)`, or `None` for SQL null.
    ///
    /// # Errors
    /// [`EvalError`] when a value cannot be converted for a comparison.
    pub fn evaluate(&self, props: &(impl Properties + ?Sized)) -> Result<Option<bool>, EvalError> {
        Ok(self.expr.eval(props)?.as_bool())
    }

    /// True when the message matches: the selector is true (null and errors do not match, as
    /// RocketMQ's broker treats them).
    pub fn matches(&self, props: &(impl Properties + ?Sized)) -> bool {
        matches!(self.evaluate(props), Ok(Some(true)))
    }
}

/// The parsed form, fully parenthesized; it parses back to the same selector.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.expr)
    }
}
