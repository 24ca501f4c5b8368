//! Tokens of the selector grammar (RocketMQ's `SelectorParser.jj`): reserved words and
//! identifiers are case-insensitive, `--` comments run to a line end, `/* */` comments nest
//! nothing, strings are single-quoted with `''` for a quote.

use crate::ParseError;

/// One token and the byte offset where it starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub(crate) kind: Tok,
    pub(crate) at: usize,
}

/// Token kinds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    Not,
    And,
    Or,
    Between,
    In,
    True,
    False,
    Null,
    Is,
    Contains,
    StartsWith,
    EndsWith,
    /// A decimal literal as written (an `l`/`L` suffix removed).
    Decimal(String),
    /// A floating-point literal as written.
    Float(String),
    /// A string literal, quotes removed and `''` decoded.
    Str(String),
    /// A property name, case kept.
    Id(String),
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
    LParen,
    RParen,
    Comma,
    Plus,
    Minus,
    End,
}

impl Tok {
    /// How the token reads in an error message.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Decimal(s) | Tok::Float(s) => s.clone(),
            Tok::Str(s) => format!("'{}'", s.replace('\'', "''")),
            Tok::Id(s) => s.clone(),
            Tok::End => "end of expression".to_owned(),
            other => format!("{other:?}").to_uppercase(),
        }
    }
}

fn is_id_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b'$'
}

fn is_id_part(c: u8) -> bool {
    is_id_start(c) || c.is_ascii_digit()
}

/// Splits `sql` into tokens, ending with [`Tok::End`].
pub(crate) fn tokenize(sql: &str) -> Result<Vec<Token>, ParseError> {
    let b = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let at = i;
        match c {
            b' ' | b'\t' | b'\n' | b'\r' | 0x0c => i += 1,
            b'-' if b.get(i + 1) == Some(&b'-') => {
                // A line comment must end with a line break (as the grammar's LINE_COMMENT).
                match b[i..].iter().position(|&c| c == b'\n' || c == b'\r') {
                    Some(n) => i += n + 1,
                    None => return Err(ParseError::at(at, "comment not ended by a line break")),
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => match sql[i + 2..].find("*/") {
                Some(n) => i += n + 4,
                None => return Err(ParseError::at(at, "comment not closed")),
            },
            b'\'' => {
                let mut s = String::new();
                let mut j = i + 1;
                loop {
                    match sql[j..].find('\'') {
                        None => return Err(ParseError::at(at, "string literal not closed")),
                        Some(n) => {
                            s.push_str(&sql[j..j + n]);
                            j += n + 1;
                            if b.get(j) == Some(&b'\'') {
                                s.push('\'');
                                j += 1;
                            } else {
                                break;
                            }
                        }
                    }
                }
                out.push(Token {
                    kind: Tok::Str(s),
                    at,
                });
                i = j;
            }
            b'0'..=b'9' | b'.' => {
                let (kind, end) = number(sql, i)?;
                out.push(Token { kind, at });
                i = end;
            }
            c if is_id_start(c) => {
                let mut j = i + 1;
                while j < b.len() && is_id_part(b[j]) {
                    j += 1;
                }
                let word = &sql[i..j];
                let kind = match word.to_ascii_uppercase().as_str() {
                    "NOT" => Tok::Not,
                    "AND" => Tok::And,
                    "OR" => Tok::Or,
                    "BETWEEN" => Tok::Between,
                    "IN" => Tok::In,
                    "TRUE" => Tok::True,
                    "FALSE" => Tok::False,
                    "NULL" => Tok::Null,
                    "IS" => Tok::Is,
                    "CONTAINS" => Tok::Contains,
                    "STARTSWITH" => Tok::StartsWith,
                    "ENDSWITH" => Tok::EndsWith,
                    _ => Tok::Id(word.to_owned()),
                };
                out.push(Token { kind, at });
                i = j;
            }
            _ => {
                let two = b.get(i + 1).copied();
                let (kind, len) = match (c, two) {
                    (b'<', Some(b'>')) => (Tok::Ne, 2),
                    (b'<', Some(b'=')) => (Tok::Le, 2),
                    (b'>', Some(b'=')) => (Tok::Ge, 2),
                    (b'<', _) => (Tok::Lt, 1),
                    (b'>', _) => (Tok::Gt, 1),
                    (b'=', _) => (Tok::Eq, 1),
                    (b'(', _) => (Tok::LParen, 1),
                    (b')', _) => (Tok::RParen, 1),
                    (b',', _) => (Tok::Comma, 1),
                    (b'+', _) => (Tok::Plus, 1),
                    (b'-', _) => (Tok::Minus, 1),
                    _ => {
                        let ch = sql[i..].chars().next().unwrap_or('?');
                        return Err(ParseError::at(at, format!("unexpected character '{ch}'")));
                    }
                };
                out.push(Token { kind, at });
                i += len;
            }
        }
    }
    out.push(Token {
        kind: Tok::End,
        at: sql.len(),
    });
    Ok(out)
}

/// A numeric literal starting at `i`: `0`, `[1-9][0-9]*[lL]?`, or a float (`5.`, `5.5`, `.5`,
/// each with an optional exponent, or `5E10`). Returns the token and where it ends.
fn number(sql: &str, i: usize) -> Result<(Tok, usize), ParseError> {
    let b = sql.as_bytes();
    let digits = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        j
    };
    let int_end = digits(i);
    let mut j = int_end;
    let mut float = false;
    if b.get(j) == Some(&b'.') {
        let frac_end = digits(j + 1);
        if int_end == i && frac_end == j + 1 {
            return Err(ParseError::at(i, "unexpected character '.'"));
        }
        j = frac_end;
        float = true;
    }
    if matches!(b.get(j), Some(b'e' | b'E')) {
        let mut k = j + 1;
        if matches!(b.get(k), Some(b'+' | b'-')) {
            k += 1;
        }
        let exp_end = digits(k);
        if exp_end > k {
            j = exp_end;
            float = true;
        }
    }
    if float {
        return Ok((Tok::Float(sql[i..j].to_owned()), j));
    }
    // DECIMAL_LITERAL: "0" alone, or no leading zero.
    if b[i] == b'0' {
        return Ok((Tok::Decimal("0".to_owned()), i + 1));
    }
    let text = sql[i..int_end].to_owned();
    let mut end = int_end;
    if matches!(b.get(end), Some(b'l' | b'L')) {
        end += 1;
    }
    Ok((Tok::Decimal(text), end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(s: &str) -> Vec<Tok> {
        tokenize(s).unwrap().into_iter().map(|t| t.kind).collect()
    }

    #[test]
    fn words_are_case_insensitive_and_names_keep_their_case() {
        assert_eq!(
            kinds("a Is nOt NuLl and notX"),
            vec![
                Tok::Id("a".into()),
                Tok::Is,
                Tok::Not,
                Tok::Null,
                Tok::And,
                Tok::Id("notX".into()),
                Tok::End
            ]
        );
    }

    #[test]
    fn literals() {
        assert_eq!(
            kinds("12L 5. .5 5e3 1.5E-2 'it''s' 0"),
            vec![
                Tok::Decimal("12".into()),
                Tok::Float("5.".into()),
                Tok::Float(".5".into()),
                Tok::Float("5e3".into()),
                Tok::Float("1.5E-2".into()),
                Tok::Str("it's".into()),
                Tok::Decimal("0".into()),
                Tok::End
            ]
        );
    }

    #[test]
    fn operators_and_comments() {
        assert_eq!(
            kinds("a<>1 /* x */ -- y\n b<=2"),
            vec![
                Tok::Id("a".into()),
                Tok::Ne,
                Tok::Decimal("1".into()),
                Tok::Id("b".into()),
                Tok::Le,
                Tok::Decimal("2".into()),
                Tok::End
            ]
        );
        assert!(tokenize("a = 1 -- no line break").is_err());
        assert!(tokenize("a = 'open").is_err());
        assert!(tokenize("a != 1").is_err());
        assert!(tokenize("a.b = 1").is_err());
    }
}
