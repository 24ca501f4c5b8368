//! Recursive-descent parser of RocketMQ's selector grammar, with its compile-time checks
//! (`ComparisonExpression.check*`, `createBetween`, `createInFilter`, `asBooleanExpression`).
//!
//! ```text
//! selector   := or
//! or         := and (OR and)*
//! and        := equality (AND equality)*
//! equality   := comparison ( '=' comparison | '<>' comparison | IS NULL | IS NOT NULL )*
//! comparison := unary ( ('>'|'>='|'<'|'<=') unary
//!                     | [NOT] (CONTAINS|STARTSWITH|ENDSWITH) string
//!                     | [NOT] BETWEEN unary AND unary
//!                     | [NOT] IN '(' string (',' string)* ')' )*
//! unary      := '+' unary | '-' unary | NOT unary | primary
//! primary    := literal | identifier | '(' or ')'
//! ```

use crate::ast::{CmpOp, Expr, Lit, StrOp};
use crate::lexer::{tokenize, Tok, Token};
use crate::value::{compare, Value};
use crate::{ParseError, MAX_DEPTH};

/// A parsed sub-expression and the depth of its tree.
struct Node {
    expr: Expr,
    depth: usize,
}

impl Node {
    fn leaf(expr: Expr) -> Self {
        Self { expr, depth: 1 }
    }
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

/// Parses a selector into a boolean expression.
pub(crate) fn parse(sql: &str) -> Result<Expr, ParseError> {
    let tokens = tokenize(sql)?;
    let mut p = Parser { tokens, pos: 0 };
    let node = p.or(0)?;
    let t = p.peek();
    if t.kind != Tok::End {
        return Err(ParseError::at(
            t.at,
            format!("unexpected {}", t.kind.describe()),
        ));
    }
    as_boolean(node, 0).map(|n| n.expr)
}

/// A node one level above `children`, refused past [`MAX_DEPTH`].
fn above(expr: Expr, children: &[usize], at: usize) -> Result<Node, ParseError> {
    let depth = children.iter().copied().max().unwrap_or(0) + 1;
    if depth > MAX_DEPTH {
        return Err(ParseError::at(
            at,
            format!("expression nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    Ok(Node { expr, depth })
}

/// RocketMQ's `asBooleanExpression`: boolean expressions stay, a property becomes a boolean
/// cast (false unless its value is a boolean, which a property's string never is), anything
/// else is an error.
fn as_boolean(n: Node, at: usize) -> Result<Node, ParseError> {
    if n.expr.is_boolean() {
        return Ok(n);
    }
    if let Expr::Prop(name) = n.expr {
        return Ok(Node {
            expr: Expr::BoolCast(name),
            depth: n.depth,
        });
    }
    Err(ParseError::at(
        at,
        format!("expression will not result in a boolean value: {}", n.expr),
    ))
}

/// `checkLessThanOperand`: only numbers (and non-boolean expressions) can be ordered.
fn check_orderable(n: &Node, at: usize) -> Result<(), ParseError> {
    let ok = match &n.expr {
        Expr::Lit(l) => matches!(l, Lit::Int(_) | Lit::Long(_) | Lit::Double(_)),
        e => !e.is_boolean(),
    };
    if ok {
        Ok(())
    } else {
        Err(ParseError::at(
            at,
            format!("value '{}' cannot be compared", n.expr),
        ))
    }
}

/// `checkEqualOperand` and `checkEqualOperandCompatability`.
fn check_equal(l: &Node, r: &Node, at: usize) -> Result<(), ParseError> {
    for n in [l, r] {
        if let Expr::Lit(Lit::Null) = n.expr {
            return Err(ParseError::at(
                at,
                "'NULL' cannot be compared (use IS NULL)",
            ));
        }
    }
    if let (Expr::Lit(a @ Lit::Bool(_)), Expr::Lit(b)) = (&l.expr, &r.expr) {
        if !matches!(b, Lit::Bool(_)) {
            return Err(ParseError::at(
                at,
                format!("'{a}' cannot be compared with '{b}'"),
            ));
        }
    }
    Ok(())
}

impl Parser {
    fn peek(&self) -> &Token {
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn peek_at(&self, ahead: usize) -> &Tok {
        &self.tokens[(self.pos + ahead).min(self.tokens.len() - 1)].kind
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn expect(&mut self, want: &Tok, what: &str) -> Result<usize, ParseError> {
        let t = self.next();
        if &t.kind == want {
            Ok(t.at)
        } else {
            Err(ParseError::at(
                t.at,
                format!("expected {what}, found {}", t.kind.describe()),
            ))
        }
    }

    fn string(&mut self) -> Result<String, ParseError> {
        let t = self.next();
        match t.kind {
            Tok::Str(s) => Ok(s),
            other => Err(ParseError::at(
                t.at,
                format!("expected a string literal, found {}", other.describe()),
            )),
        }
    }

    fn nest(depth: usize, at: usize) -> Result<usize, ParseError> {
        if depth >= MAX_DEPTH {
            return Err(ParseError::at(
                at,
                format!("expression nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        Ok(depth + 1)
    }

    fn or(&mut self, depth: usize) -> Result<Node, ParseError> {
        let at = self.peek().at;
        let first = self.and(depth)?;
        if self.peek().kind != Tok::Or {
            return Ok(first);
        }
        let first = as_boolean(first, at)?;
        let mut depths = vec![first.depth];
        let mut terms = vec![first.expr];
        while self.peek().kind == Tok::Or {
            self.next();
            let at = self.peek().at;
            let n = as_boolean(self.and(depth)?, at)?;
            depths.push(n.depth);
            terms.push(n.expr);
        }
        above(Expr::Or(terms), &depths, at)
    }

    fn and(&mut self, depth: usize) -> Result<Node, ParseError> {
        let at = self.peek().at;
        let first = self.equality(depth)?;
        if self.peek().kind != Tok::And {
            return Ok(first);
        }
        let first = as_boolean(first, at)?;
        let mut depths = vec![first.depth];
        let mut terms = vec![first.expr];
        while self.peek().kind == Tok::And {
            self.next();
            let at = self.peek().at;
            let n = as_boolean(self.equality(depth)?, at)?;
            depths.push(n.depth);
            terms.push(n.expr);
        }
        above(Expr::And(terms), &depths, at)
    }

    fn equality(&mut self, depth: usize) -> Result<Node, ParseError> {
        let mut left = self.comparison(depth)?;
        loop {
            let at = self.peek().at;
            match self.peek().kind {
                Tok::Eq | Tok::Ne => {
                    let ne = self.next().kind == Tok::Ne;
                    let right = self.comparison(depth)?;
                    check_equal(&left, &right, at)?;
                    let eq = above(
                        Expr::Eq(Box::new(left.expr), Box::new(right.expr)),
                        &[left.depth, right.depth],
                        at,
                    )?;
                    left = if ne {
                        above(Expr::Not(Box::new(eq.expr)), &[eq.depth], at)?
                    } else {
                        eq
                    };
                }
                Tok::Is => {
                    self.next();
                    let not = self.peek().kind == Tok::Not;
                    if not {
                        self.next();
                    }
                    self.expect(&Tok::Null, "NULL after IS")?;
                    let null = Box::new(Expr::Lit(Lit::Null));
                    let eq = above(Expr::Eq(Box::new(left.expr), null), &[left.depth], at)?;
                    left = if not {
                        above(Expr::Not(Box::new(eq.expr)), &[eq.depth], at)?
                    } else {
                        eq
                    };
                }
                _ => return Ok(left),
            }
        }
    }

    fn comparison(&mut self, depth: usize) -> Result<Node, ParseError> {
        let mut left = self.unary(depth)?;
        loop {
            let at = self.peek().at;
            let op = match self.peek().kind {
                Tok::Gt => Some(CmpOp::Gt),
                Tok::Ge => Some(CmpOp::Ge),
                Tok::Lt => Some(CmpOp::Lt),
                Tok::Le => Some(CmpOp::Le),
                _ => None,
            };
            if let Some(op) = op {
                self.next();
                let right = self.unary(depth)?;
                check_orderable(&left, at)?;
                check_orderable(&right, at)?;
                left = above(
                    Expr::Cmp(op, Box::new(left.expr), Box::new(right.expr)),
                    &[left.depth, right.depth],
                    at,
                )?;
                continue;
            }
            let not = self.peek().kind == Tok::Not
                && matches!(
                    self.peek_at(1),
                    Tok::Contains | Tok::StartsWith | Tok::EndsWith | Tok::Between | Tok::In
                );
            if not {
                self.next();
            }
            left = match self.peek().kind {
                Tok::Contains | Tok::StartsWith | Tok::EndsWith => {
                    let op = match self.next().kind {
                        Tok::Contains => StrOp::Contains,
                        Tok::StartsWith => StrOp::StartsWith,
                        _ => StrOp::EndsWith,
                    };
                    let search = self.string()?;
                    above(
                        Expr::StrOp {
                            op,
                            not,
                            operand: Box::new(left.expr),
                            search,
                        },
                        &[left.depth],
                        at,
                    )?
                }
                Tok::Between => {
                    self.next();
                    let low = self.unary(depth)?;
                    self.expect(&Tok::And, "AND in BETWEEN")?;
                    let high = self.unary(depth)?;
                    self.between(left, low, high, not, at)?
                }
                Tok::In => {
                    self.next();
                    self.expect(&Tok::LParen, "'(' after IN")?;
                    let mut list = vec![self.string()?];
                    while self.peek().kind == Tok::Comma {
                        self.next();
                        list.push(self.string()?);
                    }
                    self.expect(&Tok::RParen, "')' to close the IN list")?;
                    let Expr::Prop(name) = left.expr else {
                        return Err(ParseError::at(
                            at,
                            format!("expected a property for IN, got: {}", left.expr),
                        ));
                    };
                    Node::leaf(Expr::In { name, list, not })
                }
                _ => return Ok(left),
            };
        }
    }

    /// `createBetween` / `createNotBetween`: constant bounds must be non-null and in order.
    fn between(
        &mut self,
        value: Node,
        low: Node,
        high: Node,
        not: bool,
        at: usize,
    ) -> Result<Node, ParseError> {
        if !not {
            if let (Expr::Lit(l), Expr::Lit(h)) = (&low.expr, &high.expr) {
                if matches!(l, Lit::Null) || matches!(h, Lit::Null) {
                    return Err(ParseError::at(
                        at,
                        "illegal values of between, values can not be null",
                    ));
                }
                let ord =
                    compare(h.value(), l.value()).map_err(|e| ParseError::at(at, e.to_string()))?;
                if ord.is_lt() {
                    return Err(ParseError::at(
                        at,
                        format!("illegal values of between, left value ({l}) must be less than or equal to right value ({h})"),
                    ));
                }
            }
        }
        for n in [&value, &low, &high] {
            check_orderable(n, at)?;
        }
        let (lo_op, hi_op) = if not {
            (CmpOp::Lt, CmpOp::Gt)
        } else {
            (CmpOp::Ge, CmpOp::Le)
        };
        let lo = Expr::Cmp(lo_op, Box::new(value.expr.clone()), Box::new(low.expr));
        let hi = Expr::Cmp(hi_op, Box::new(value.expr), Box::new(high.expr));
        // Two levels: the comparisons, then the AND (OR) over them.
        let below = value.depth.max(low.depth).max(high.depth) + 1;
        let both = if not {
            Expr::Or(vec![lo, hi])
        } else {
            Expr::And(vec![lo, hi])
        };
        above(both, &[below], at)
    }

    fn unary(&mut self, depth: usize) -> Result<Node, ParseError> {
        let t = self.peek().clone();
        match t.kind {
            Tok::Plus => {
                self.next();
                let depth = Self::nest(depth, t.at)?;
                self.unary(depth)
            }
            Tok::Minus => {
                self.next();
                let depth = Self::nest(depth, t.at)?;
                let n = self.unary(depth)?;
                above(Expr::Negate(Box::new(n.expr)), &[n.depth], t.at)
            }
            Tok::Not => {
                self.next();
                let depth = Self::nest(depth, t.at)?;
                let at = self.peek().at;
                let n = as_boolean(self.unary(depth)?, at)?;
                above(Expr::Not(Box::new(n.expr)), &[n.depth], t.at)
            }
            _ => self.primary(depth),
        }
    }

    fn primary(&mut self, depth: usize) -> Result<Node, ParseError> {
        let t = self.next();
        let lit = match t.kind {
            Tok::Str(s) => Lit::Str(s),
            Tok::Decimal(d) => decimal(&d, t.at)?,
            Tok::Float(f) => float(&f, t.at)?,
            Tok::True => Lit::Bool(true),
            Tok::False => Lit::Bool(false),
            Tok::Null => Lit::Null,
            Tok::Id(name) => return Ok(Node::leaf(Expr::Prop(name))),
            Tok::LParen => {
                let depth = Self::nest(depth, t.at)?;
                let n = self.or(depth)?;
                self.expect(&Tok::RParen, "')'")?;
                return Ok(n);
            }
            other => {
                return Err(ParseError::at(
                    t.at,
                    format!("unexpected {}", other.describe()),
                ))
            }
        };
        Ok(Node::leaf(Expr::Lit(lit)))
    }
}

/// `ConstantExpression.createFromDecimal`: a 64-bit value, kept as 32 bits when it fits.
fn decimal(text: &str, at: usize) -> Result<Lit, ParseError> {
    let v: i64 = text
        .parse()
        .map_err(|_| ParseError::at(at, format!("{text} does not fit a 64-bit integer")))?;
    Ok(i32::try_from(v).map_or(Lit::Long(v), Lit::Int))
}

/// `ConstantExpression.createFloat`. As in RocketMQ, a literal that is not finite, or below
/// Java's `Double.MIN_VALUE` (so `0.0` too), is refused.
fn float(text: &str, at: usize) -> Result<Lit, ParseError> {
    let v: f64 = text
        .parse()
        .map_err(|_| ParseError::at(at, format!("{text} is not a number")))?;
    if v > f64::MAX {
        return Err(ParseError::at(
            at,
            format!("{text} is greater than {}", f64::MAX),
        ));
    }
    if v < f64::from_bits(1) {
        return Err(ParseError::at(
            at,
            format!("{text} is less than 4.9E-324 (RocketMQ refuses zero and subnormal float literals; write 0)"),
        ));
    }
    Ok(Lit::Double(v))
}

impl Lit {
    pub(crate) fn value(&self) -> Value<'_> {
        match self {
            Lit::Null => Value::Null,
            Lit::Bool(b) => Value::Bool(*b),
            Lit::Int(i) => Value::Int(*i),
            Lit::Long(l) => Value::Long(*l),
            Lit::Double(d) => Value::Double(*d),
            Lit::Str(s) => Value::Str(s),
        }
    }
}
