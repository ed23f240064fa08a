//! Answers as trees: the parser from [`lex`](super::lex) tokens.
//!
//! An answer is a list of items (separated by `,` `;` `and` `or` at the top level); an item is an
//! expression, possibly a relation chain `a = b = c` or a `\pm` pair. Brackets with commas inside
//! are tuples or intervals, `\{..\}` a set, `A \cup B` a union. Operators follow the usual
//! precedence; juxtaposition multiplies (`2x`, `2\sqrt3`, `(x+1)(x-1)`) except for a mixed number
//! (`2\frac{1}{2}` is 5/2); words after an operand are units and dropped (`5 cm`, `12 apples`).
//!
//! Every failure (an unbalanced bracket, a word where an operand should be, an inequality, nesting
//! deeper than [`MAX_DEPTH`]) is `None`, and the caller compares the answers as text.

use super::lex::{Func, Tok};

/// Deepest nesting the parser follows (bounded work and stack on pathological input).
pub const MAX_DEPTH: usize = 64;

/// An expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Num(f64),
    Var(String),
    Pi,
    Euler,
    Infinity,
    Neg(Box<Node>),
    Add(Box<Node>, Box<Node>),
    Sub(Box<Node>, Box<Node>),
    Mul(Box<Node>, Box<Node>),
    Div(Box<Node>, Box<Node>),
    Pow(Box<Node>, Box<Node>),
    /// `\sqrt[n]{x}`: (radicand, index).
    Root(Box<Node>, Box<Node>),
    Func(Func, Box<Node>),
    /// `\log_b x`: (base, argument).
    LogBase(Box<Node>, Box<Node>),
    Factorial(Box<Node>),
    Binom(Box<Node>, Box<Node>),
    Abs(Box<Node>),
    Percent(Box<Node>),
    /// `a \pm b` (`a` absent for a leading `\pm b`).
    PlusMinus(Option<Box<Node>>, Box<Node>),
    /// Brackets around two or more items: a tuple or an interval, by its brackets.
    Bracketed {
        open: char,
        close: char,
        items: Vec<Node>,
    },
    Set(Vec<Node>),
    Union(Vec<Node>),
    /// `a = b (= c …)`.
    Relation(Vec<Node>),
    /// `a < b (≤ c …)`: the sides and, between each pair, `(less, strict)`.
    Inequality(Vec<Node>, Vec<(bool, bool)>),
    /// An angle in degrees (`30^\circ`); its value is in radians.
    Degrees(Box<Node>),
}

/// Parses an answer into its top-level items.
pub fn parse_answer(toks: &[Tok]) -> Option<Vec<Node>> {
    let mut p = Parser { toks, at: 0 };
    let items = p.items(0)?;
    (p.at == toks.len() && !items.is_empty()).then_some(items)
}

struct Parser<'a> {
    toks: &'a [Tok],
    at: usize,
}

fn bx(n: Node) -> Box<Node> {
    Box::new(n)
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// Items separated by commas and conjunctions, up to a closing bracket or the end.
    fn items(&mut self, depth: usize) -> Option<Vec<Node>> {
        let mut items = vec![];
        loop {
            // "2, and 7", "x = 1 or x = 2": separators may repeat.
            while matches!(self.peek(), Some(Tok::Comma | Tok::Conj)) {
                self.at += 1;
            }
            if matches!(
                self.peek(),
                None | Some(Tok::RParen | Tok::RBrack | Tok::RSet | Tok::RBrace)
            ) {
                return Some(items);
            }
            items.push(self.relation(depth)?);
            if !matches!(self.peek(), Some(Tok::Comma | Tok::Conj)) {
                return Some(items);
            }
        }
    }

    /// A chain of `=` (a relation) or of `<`/`≤`/`>`/`≥` (an inequality); mixed chains are not
    /// compared.
    fn relation(&mut self, depth: usize) -> Option<Node> {
        let mut sides = vec![self.union(depth)?];
        let (mut equalities, mut comparisons) = (0, vec![]);
        loop {
            match self.peek() {
                Some(Tok::Eq) => equalities += 1,
                Some(&Tok::Compare { less, strict }) => comparisons.push((less, strict)),
                _ => break,
            }
            self.at += 1;
            sides.push(self.union(depth)?);
        }
        match (equalities, comparisons.is_empty()) {
            (0, true) => Some(sides.remove(0)),
            (_, true) => Some(Node::Relation(sides)),
            (0, false) => Some(Node::Inequality(sides, comparisons)),
            _ => None,
        }
    }

    fn union(&mut self, depth: usize) -> Option<Node> {
        let mut parts = vec![self.sum(depth)?];
        while self.eat(&Tok::Cup) {
            parts.push(self.sum(depth)?);
        }
        Some(if parts.len() == 1 {
            parts.remove(0)
        } else {
            Node::Union(parts)
        })
    }

    fn sum(&mut self, depth: usize) -> Option<Node> {
        let mut left = if self.eat(&Tok::PlusMinus) {
            Node::PlusMinus(None, bx(self.product(depth)?))
        } else {
            self.product(depth)?
        };
        loop {
            left = match self.peek() {
                Some(Tok::Plus) => {
                    self.at += 1;
                    Node::Add(bx(left), bx(self.product(depth)?))
                }
                Some(Tok::Minus) => {
                    self.at += 1;
                    Node::Sub(bx(left), bx(self.product(depth)?))
                }
                Some(Tok::PlusMinus) => {
                    self.at += 1;
                    Node::PlusMinus(Some(bx(left)), bx(self.product(depth)?))
                }
                _ => return Some(left),
            };
        }
    }

    fn product(&mut self, depth: usize) -> Option<Node> {
        let mut left = self.unary(depth)?;
        loop {
            left = match self.peek() {
                Some(Tok::Star) => {
                    self.at += 1;
                    Node::Mul(bx(left), bx(self.unary(depth)?))
                }
                Some(Tok::Slash) => {
                    self.at += 1;
                    Node::Div(bx(left), bx(self.unary(depth)?))
                }
                Some(Tok::Word(w)) => match scale(w) {
                    // "1 million dollars"
                    Some(factor) => {
                        self.at += 1;
                        Node::Mul(bx(left), bx(Node::Num(factor)))
                    }
                    None => {
                        self.skip_unit();
                        left
                    }
                },
                Some(t) if starts_operand(t) => Node::Mul(bx(left), bx(self.power(depth)?)),
                _ => return Some(left),
            };
        }
    }

    /// A unit after an operand, with its exponent (`cm^2`), is dropped.
    fn skip_unit(&mut self) {
        self.at += 1;
        if self.peek() == Some(&Tok::Caret)
            && matches!(self.toks.get(self.at + 1), Some(Tok::Num { .. }))
        {
            self.at += 2;
        }
    }

    fn unary(&mut self, depth: usize) -> Option<Node> {
        if depth > MAX_DEPTH {
            return None;
        }
        if self.eat(&Tok::Minus) {
            return Some(Node::Neg(bx(self.unary(depth + 1)?)));
        }
        if self.eat(&Tok::Plus) {
            return self.unary(depth + 1);
        }
        self.power(depth)
    }

    fn power(&mut self, depth: usize) -> Option<Node> {
        if depth > MAX_DEPTH {
            return None;
        }
        let base = self.postfix(depth)?;
        if self.eat(&Tok::Caret) {
            // Right-associative, and `2^-1` is fine; `-2^2` is -(2^2) by the caller's order.
            let exponent = self.exponent(depth + 1)?;
            return self.after_power(Node::Pow(bx(base), bx(exponent)));
        }
        Some(base)
    }

    /// A `^` operand: a group, or one token (`x^2y` is x²·y, as TeX reads it).
    fn exponent(&mut self, depth: usize) -> Option<Node> {
        match self.peek()? {
            Tok::LBrace | Tok::LParen => self.unary(depth),
            Tok::Minus | Tok::Plus => self.unary(depth),
            Tok::Num { value, .. } => {
                let v = *value;
                self.at += 1;
                Some(Node::Num(v))
            }
            _ => self.atom(depth),
        }
    }

    /// Postfix `!` and `%` after a power (`10^2\%`).
    fn after_power(&mut self, mut node: Node) -> Option<Node> {
        loop {
            node = match self.peek() {
                Some(Tok::Bang) => Node::Factorial(bx(node)),
                Some(Tok::Percent) => Node::Percent(bx(node)),
                Some(Tok::Degree) => Node::Degrees(bx(node)),
                _ => return Some(node),
            };
            self.at += 1;
        }
    }

    fn postfix(&mut self, depth: usize) -> Option<Node> {
        let node = self.atom(depth)?;
        self.after_power(node)
    }

    fn atom(&mut self, depth: usize) -> Option<Node> {
        if depth > MAX_DEPTH {
            return None;
        }
        let d = depth + 1;
        let tok = self.peek()?.clone();
        self.at += 1;
        Some(match tok {
            Tok::Num { value, int } => match int.then(|| self.mixed_fraction(d)).flatten() {
                Some(fraction) => Node::Num(value + fraction),
                None => Node::Num(value),
            },
            Tok::Var(name) => Node::Var(name),
            Tok::Pi => Node::Pi,
            Tok::Euler => Node::Euler,
            Tok::Infinity => Node::Infinity,
            Tok::Frac => Node::Div(bx(self.arg(d)?), bx(self.arg(d)?)),
            Tok::Binom => Node::Binom(bx(self.arg(d)?), bx(self.arg(d)?)),
            Tok::Sqrt => {
                let index = if self.eat(&Tok::LBrack) {
                    let n = self.sum(d)?;
                    self.eat(&Tok::RBrack).then_some(n)?
                } else {
                    Node::Num(2.0)
                };
                Node::Root(bx(self.arg(d)?), bx(index))
            }
            Tok::Func(f) => self.function(f, d)?,
            Tok::LBrace => {
                let inner = self.items(d)?;
                self.eat(&Tok::RBrace).then_some(())?;
                match <[Node; 1]>::try_from(inner) {
                    Ok([one]) => one,
                    Err(_) => return None,
                }
            }
            Tok::LSet => {
                let inner = self.items(d)?;
                // `\{x \mid x > 1\}`: the set is what its condition describes.
                if inner.len() == 1 && self.eat(&Tok::Bar) {
                    let condition = self.relation(d)?;
                    self.eat(&Tok::RSet).then_some(())?;
                    return Some(condition);
                }
                self.eat(&Tok::RSet).then_some(())?;
                Node::Set(inner)
            }
            Tok::Bar => {
                let inner = self.sum(d)?;
                self.eat(&Tok::Bar).then_some(())?;
                Node::Abs(bx(inner))
            }
            Tok::LParen | Tok::LBrack => self.bracketed(tok, d)?,
            _ => return None,
        })
    }

    /// The fraction of a mixed number after its whole part: `2\frac{1}{2}`, or `1 1/2` as plain
    /// text writes it; a proper fraction of whole numbers, else nothing is consumed.
    fn mixed_fraction(&mut self, depth: usize) -> Option<f64> {
        let save = self.at;
        let proper = |n: f64, m: f64| n.fract() == 0.0 && m.fract() == 0.0 && m > n && n > 0.0;
        if self.eat(&Tok::Frac) {
            if let (Some(Node::Num(n)), Some(Node::Num(m))) = (self.arg(depth), self.arg(depth))
                && proper(n, m)
            {
                return Some(n / m);
            }
        } else if let (
            Some(&Tok::Num { value: n, .. }),
            Some(Tok::Slash),
            Some(&Tok::Num { value: m, .. }),
        ) = (
            self.toks.get(self.at),
            self.toks.get(self.at + 1),
            self.toks.get(self.at + 2),
        ) && proper(n, m)
        {
            self.at += 3;
            return Some(n / m);
        }
        self.at = save;
        None
    }

    /// `(..)` or `[..]`: a group with one item, else a tuple or an interval closed by `)` or `]`.
    fn bracketed(&mut self, open: Tok, depth: usize) -> Option<Node> {
        let mut inner = self.items(depth)?;
        let close = match self.peek()? {
            Tok::RParen => ')',
            Tok::RBrack => ']',
            _ => return None,
        };
        self.at += 1;
        let open = if open == Tok::LParen { '(' } else { '[' };
        if inner.len() == 1 {
            return Some(inner.remove(0));
        }
        (inner.len() >= 2).then_some(Node::Bracketed {
            open,
            close,
            items: inner,
        })
    }

    /// A macro argument: a `{..}` group or one token (the lexer splits `\frac12` into digits).
    fn arg(&mut self, depth: usize) -> Option<Node> {
        self.atom(depth)
    }

    /// `\sin x`, `\sin(x)`, `\sin^2 x`, `\log_2 8`.
    fn function(&mut self, f: Func, depth: usize) -> Option<Node> {
        let mut base = None;
        if f == Func::Log && self.eat(&Tok::Underscore) {
            base = Some(self.arg(depth)?);
        }
        let mut power = None;
        if self.eat(&Tok::Caret) {
            power = Some(self.exponent(depth)?);
        }
        let argument = self.power(depth)?;
        let applied = match base {
            Some(b) => Node::LogBase(bx(b), bx(argument)),
            None => Node::Func(f, bx(argument)),
        };
        Some(match power {
            Some(p) => Node::Pow(bx(applied), bx(p)),
            None => applied,
        })
    }
}

/// The factor of a number word (`thousand`, `million`, …).
fn scale(word: &str) -> Option<f64> {
    Some(match word {
        "thousand" => 1e3,
        "million" => 1e6,
        "billion" => 1e9,
        "trillion" => 1e12,
        _ => return None,
    })
}

/// Whether `t` can begin an operand (so that juxtaposition multiplies).
fn starts_operand(t: &Tok) -> bool {
    matches!(
        t,
        Tok::Num { .. }
            | Tok::Var(_)
            | Tok::Pi
            | Tok::Euler
            | Tok::Infinity
            | Tok::Func(_)
            | Tok::Frac
            | Tok::Sqrt
            | Tok::Binom
            | Tok::LParen
            | Tok::LBrace
    )
}
