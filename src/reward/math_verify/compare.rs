//! Whether two parsed answers are the same mathematical object.
//!
//! Numbers are compared by value (relative tolerance [`REL_TOL`]); expressions with variables by
//! evaluating both at [`POINTS`] pseudo-random points (the same points for the same variable names),
//! so `x^2+2x+1` equals `(x+1)^2` and `\sqrt{12}` equals `2\sqrt3`. Tuples and intervals compare in
//! order with their brackets (`[0,1)` is not `[0,1]`); sets, unions and lists of several answers
//! regardless of order. `x = 5` equals `5`; `\pm` stands for both of its values.

use std::collections::BTreeSet;

use super::lex::Func;
use super::parse::Node;

/// Relative tolerance of a numeric comparison. Tight on purpose: `3.14159` is not `\pi`.
pub const REL_TOL: f64 = 1e-8;
/// Points at which expressions with variables are compared.
pub const POINTS: u64 = 8;
/// Largest list or set compared element by element (bounded work).
const MAX_ITEMS: usize = 64;

/// How answers compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// `50\%` also equals `0.5` (it always equals `50`).
    pub percent_is_fraction: bool,
}

/// Whether two answers' item lists are equal.
pub fn items_equal(a: &[Node], b: &[Node], o: Options) -> bool {
    let (a, b) = (expand(a), expand(b));
    if a.len() > MAX_ITEMS || b.len() > MAX_ITEMS {
        return false;
    }
    match (a.as_slice(), b.as_slice()) {
        ([one], [other]) => equal(one, other, o),
        // "{2, 7}" against "2 and 7"; "(1, 2)" against "1, 2".
        ([Node::Set(set)], list) | (list, [Node::Set(set)]) if list.len() > 1 => {
            same_multiset(set, list, o)
        }
        (
            [
                Node::Bracketed {
                    open: '(',
                    close: ')',
                    items,
                },
            ],
            list,
        )
        | (
            list,
            [
                Node::Bracketed {
                    open: '(',
                    close: ')',
                    items,
                },
            ],
        ) if list.len() > 1 => in_order(items, list, o),
        _ => same_multiset(&a, &b, o),
    }
}

/// `a \pm b` is the two items `a + b` and `a - b` (also on the right of `x =`).
fn expand(items: &[Node]) -> Vec<Node> {
    let mut out = vec![];
    for item in items {
        match item {
            Node::PlusMinus(a, b) => out.extend(plus_minus(a.as_deref(), b)),
            Node::Relation(sides) if matches!(sides.last(), Some(Node::PlusMinus(..))) => {
                if let Some(Node::PlusMinus(a, b)) = sides.last() {
                    for value in plus_minus(a.as_deref(), b) {
                        let mut s = sides.clone();
                        *s.last_mut().expect("a relation has sides") = value;
                        out.push(Node::Relation(s));
                    }
                }
            }
            other => out.push(other.clone()),
        }
    }
    out
}

fn plus_minus(a: Option<&Node>, b: &Node) -> [Node; 2] {
    let b = Box::new(b.clone());
    match a {
        Some(a) => [
            Node::Add(Box::new(a.clone()), b.clone()),
            Node::Sub(Box::new(a.clone()), b),
        ],
        None => [(*b).clone(), Node::Neg(b)],
    }
}

fn in_order(a: &[Node], b: &[Node], o: Options) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| equal(x, y, o))
}

/// Equal as multisets: every element of `a` pairs with a distinct equal element of `b`.
fn same_multiset(a: &[Node], b: &[Node], o: Options) -> bool {
    if a.len() != b.len() || a.len() > MAX_ITEMS {
        return false;
    }
    let mut used = vec![false; b.len()];
    a.iter().all(|x| {
        let found = (0..b.len()).find(|&k| !used[k] && equal(x, &b[k], o));
        found.map(|k| used[k] = true).is_some()
    })
}

/// Whether two answer items are equal.
pub fn equal(a: &Node, b: &Node, o: Options) -> bool {
    match (a, b) {
        (Node::Relation(x), Node::Relation(y)) => {
            in_order(x, y, o) || (x.len() == 2 && y.len() == 2 && same_equation(x, y, o))
        }
        // `x = 5` or `m + n = 19` against a value: the value the relation gives its left side.
        (Node::Relation(sides), other) | (other, Node::Relation(sides)) => {
            let (Some(first), Some(last)) = (sides.first(), sides.last()) else {
                return false;
            };
            let names = |n: &Node| {
                let mut v = BTreeSet::new();
                variables(n, &mut v);
                v
            };
            // `9 \times 100 = 900`: a computation whose result is the last side.
            let computed = sides.iter().all(|side| names(side).is_empty());
            let gives_a_value = matches!(first, Node::Var(_))
                || computed
                || (!names(first).is_empty() && names(last).is_empty());
            gives_a_value && equal(last, other, o)
        }
        (
            Node::Bracketed {
                open: o1,
                close: c1,
                items: x,
            },
            Node::Bracketed {
                open: o2,
                close: c2,
                items: y,
            },
        ) => o1 == o2 && c1 == c2 && in_order(x, y, o),
        (Node::Set(x), Node::Set(y)) | (Node::Union(x), Node::Union(y)) => same_multiset(x, y, o),
        (Node::Inequality(..), _) | (_, Node::Inequality(..)) => {
            let (a, b) = (as_interval(a), as_interval(b));
            match (&a, &b) {
                (Node::Inequality(xs, xo), Node::Inequality(ys, yo)) => {
                    xo == yo && in_order(xs, ys, o)
                }
                (Node::Inequality(..), _) | (_, Node::Inequality(..)) => false,
                _ => equal(&a, &b, o),
            }
        }
        (Node::Percent(x), Node::Percent(y)) | (Node::Degrees(x), Node::Degrees(y)) => {
            equal(x, y, o)
        }
        // `30^\circ` is 30, and as an angle it is also π/6.
        (Node::Degrees(x), other) | (other, Node::Degrees(x)) if is_scalar(other) => {
            let radians = Node::Degrees(x.clone());
            equal(x, other, o) || scalars_equal(&radians, other)
        }
        (Node::Percent(x), other) | (other, Node::Percent(x)) if is_scalar(other) => {
            let fraction = Node::Div(x.clone(), Box::new(Node::Num(100.0)));
            equal(x, other, o) || (o.percent_is_fraction && scalars_equal(&fraction, other))
        }
        _ => is_scalar(a) && is_scalar(b) && scalars_equal(a, b),
    }
}

/// `l1 = r1` and `l2 = r2` as the same equation: `l - r` equal, or opposite.
fn same_equation(x: &[Node], y: &[Node], o: Options) -> bool {
    let diff = |s: &[Node]| Node::Sub(Box::new(s[0].clone()), Box::new(s[1].clone()));
    let (dx, dy) = (diff(x), diff(y));
    equal(&dx, &dy, o) || equal(&dx, &Node::Neg(Box::new(dy)), o)
}

/// No tuple, set, union, relation or `\pm` anywhere inside.
fn is_scalar(n: &Node) -> bool {
    match n {
        Node::Num(_) | Node::Var(_) | Node::Pi | Node::Euler | Node::Infinity => true,
        Node::Neg(x)
        | Node::Func(_, x)
        | Node::Factorial(x)
        | Node::Abs(x)
        | Node::Percent(x)
        | Node::Degrees(x) => is_scalar(x),
        Node::Add(x, y)
        | Node::Sub(x, y)
        | Node::Mul(x, y)
        | Node::Div(x, y)
        | Node::Pow(x, y)
        | Node::Root(x, y)
        | Node::LogBase(x, y)
        | Node::Binom(x, y) => is_scalar(x) && is_scalar(y),
        Node::PlusMinus(..)
        | Node::Bracketed { .. }
        | Node::Set(_)
        | Node::Union(_)
        | Node::Relation(_)
        | Node::Inequality(..) => false,
    }
}

fn variables(n: &Node, out: &mut BTreeSet<String>) {
    match n {
        Node::Var(v) => {
            out.insert(v.clone());
        }
        Node::Num(_) | Node::Pi | Node::Euler | Node::Infinity => {}
        Node::Neg(x)
        | Node::Func(_, x)
        | Node::Factorial(x)
        | Node::Abs(x)
        | Node::Percent(x)
        | Node::Degrees(x) => variables(x, out),
        Node::Add(x, y)
        | Node::Sub(x, y)
        | Node::Mul(x, y)
        | Node::Div(x, y)
        | Node::Pow(x, y)
        | Node::Root(x, y)
        | Node::LogBase(x, y)
        | Node::Binom(x, y) => {
            variables(x, out);
            variables(y, out);
        }
        Node::PlusMinus(x, y) => {
            if let Some(x) = x {
                variables(x, out);
            }
            variables(y, out);
        }
        Node::Bracketed { items, .. } | Node::Set(items) | Node::Union(items) => {
            items.iter().for_each(|i| variables(i, out))
        }
        Node::Relation(sides) | Node::Inequality(sides, _) => {
            sides.iter().for_each(|i| variables(i, out))
        }
    }
}

/// Equal as numbers, or as functions of their variables at every sample point where both are
/// defined (at least half the points must be).
fn scalars_equal(a: &Node, b: &Node) -> bool {
    let mut vars = BTreeSet::new();
    variables(a, &mut vars);
    variables(b, &mut vars);
    if vars.is_empty() {
        return close(eval(a, &|_| f64::NAN), eval(b, &|_| f64::NAN));
    }
    let mut agreed = 0;
    for point in 0..POINTS {
        let value = |name: &str| sample(name, point);
        let (x, y) = (eval(a, &value), eval(b, &value));
        match (x.is_nan(), y.is_nan()) {
            (true, true) => continue,
            (false, false) if close(x, y) => agreed += 1,
            _ => return false,
        }
    }
    agreed * 2 >= POINTS
}

/// The value of variable `name` at sample point `point`: in [0.25, 2.75), fixed per name and point,
/// so positive (square roots and logarithms are defined) and away from 0 and 1.
fn sample(name: &str, point: u64) -> f64 {
    // FNV-1a over the name, then splitmix64 with the point.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut z = h.wrapping_add(point.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    0.25 + 2.5 * ((z >> 11) as f64 / (1u64 << 53) as f64)
}

fn close(x: f64, y: f64) -> bool {
    if x.is_nan() || y.is_nan() {
        return false;
    }
    if x.is_infinite() || y.is_infinite() {
        return x == y;
    }
    (x - y).abs() <= REL_TOL * x.abs().max(y.abs()).max(1e-4)
}

/// The value of a scalar expression (NaN where undefined or not a scalar).
pub fn eval(n: &Node, var: &dyn Fn(&str) -> f64) -> f64 {
    let e = |x: &Node| eval(x, var);
    match n {
        Node::Num(v) => *v,
        Node::Var(name) => var(name),
        Node::Pi => std::f64::consts::PI,
        Node::Euler => std::f64::consts::E,
        Node::Infinity => f64::INFINITY,
        Node::Neg(x) => -e(x),
        Node::Add(x, y) => e(x) + e(y),
        Node::Sub(x, y) => e(x) - e(y),
        Node::Mul(x, y) => e(x) * e(y),
        Node::Div(x, y) => e(x) / e(y),
        Node::Pow(x, y) => e(x).powf(e(y)),
        Node::Root(x, index) => root(e(x), e(index)),
        Node::Func(f, x) => function(*f, e(x)),
        Node::LogBase(base, x) => e(x).ln() / e(base).ln(),
        Node::Factorial(x) => factorial(e(x)),
        Node::Binom(n, k) => binomial(e(n), e(k)),
        Node::Abs(x) => e(x).abs(),
        Node::Percent(x) => e(x) / 100.0,
        Node::Degrees(x) => e(x).to_radians(),
        Node::PlusMinus(..)
        | Node::Bracketed { .. }
        | Node::Set(_)
        | Node::Union(_)
        | Node::Relation(_)
        | Node::Inequality(..) => f64::NAN,
    }
}

fn root(x: f64, index: f64) -> f64 {
    if index == 2.0 {
        return x.sqrt();
    }
    // An odd root of a negative number is real: ∛-8 = -2.
    if x < 0.0 && index.fract() == 0.0 && index % 2.0 == 1.0 {
        return -(-x).powf(1.0 / index);
    }
    x.powf(1.0 / index)
}

fn function(f: Func, x: f64) -> f64 {
    match f {
        Func::Sin => x.sin(),
        Func::Cos => x.cos(),
        Func::Tan => x.tan(),
        Func::Cot => 1.0 / x.tan(),
        Func::Sec => 1.0 / x.cos(),
        Func::Csc => 1.0 / x.sin(),
        Func::Asin => x.asin(),
        Func::Acos => x.acos(),
        Func::Atan => x.atan(),
        // `\log` without a base is the natural logarithm, as in SymPy (and Math-Verify).
        Func::Ln | Func::Log => x.ln(),
        Func::Exp => x.exp(),
    }
}

/// `x!`, and Γ(x + 1) where x is not a whole number (`(n!)^2` is compared at non-integer points).
fn factorial(x: f64) -> f64 {
    if x.fract() == 0.0 && (0.0..=170.0).contains(&x) {
        return (1..=x as u32).map(f64::from).product();
    }
    if x < 0.0 && x.fract() == 0.0 {
        return f64::NAN;
    }
    libm::tgamma(x + 1.0)
}

/// `\binom{n}{k}` = n! / (k! (n - k)!), through Γ where the arguments are not whole numbers.
fn binomial(n: f64, k: f64) -> f64 {
    let whole = n.fract() == 0.0 && k.fract() == 0.0;
    if whole && (k < 0.0 || n < 0.0 || k > n) {
        return f64::NAN;
    }
    if whole && n <= 1e6 {
        let k = k.min(n - k) as u32;
        return (0..k).fold(1.0, |acc, i| acc * (n - f64::from(i)) / f64::from(i + 1));
    }
    factorial(n) / (factorial(k) * factorial(n - k))
}

/// An inequality in one variable as the interval it describes (`x \le 2` is `(-\infty, 2]`,
/// `1 < a < 2` is `(1, 2)`); anything else unchanged.
fn as_interval(n: &Node) -> Node {
    let Node::Inequality(sides, ops) = n else {
        return n.clone();
    };
    let is_var = |k: usize| matches!(sides.get(k), Some(Node::Var(_)));
    // (lower, lower closed, upper, upper closed)
    let bounds = match (sides.len(), ops.as_slice()) {
        (2, [(less, strict)]) if is_var(0) => {
            let bound = sides[1].clone();
            if *less {
                (Node::Neg(Box::new(Node::Infinity)), false, bound, !strict)
            } else {
                (bound, !strict, Node::Infinity, false)
            }
        }
        (2, [(less, strict)]) if is_var(1) => {
            let bound = sides[0].clone();
            if *less {
                (bound, !strict, Node::Infinity, false)
            } else {
                (Node::Neg(Box::new(Node::Infinity)), false, bound, !strict)
            }
        }
        (3, [(l1, s1), (l2, s2)]) if is_var(1) && l1 == l2 => {
            let (lo, lo_strict, hi, hi_strict) = if *l1 {
                (sides[0].clone(), s1, sides[2].clone(), s2)
            } else {
                (sides[2].clone(), s2, sides[0].clone(), s1)
            };
            (lo, !lo_strict, hi, !hi_strict)
        }
        _ => return n.clone(),
    };
    let (lo, lo_closed, hi, hi_closed) = bounds;
    Node::Bracketed {
        open: if lo_closed { '[' } else { '(' },
        close: if hi_closed { ']' } else { ')' },
        items: vec![lo, hi],
    }
}
