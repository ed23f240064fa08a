//! The Python side of Hugging Face chat templates, which Jinja2 under `transformers` provides and
//! minijinja leaves to the embedder: `strftime_now`, the `tojson` filter as transformers defines it,
//! and the `str`/`dict` methods templates call (`content.strip()`, `s.startswith(..)`, `d.items()`).

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error as JinjaError, ErrorKind, State, Value};

/// `strftime` for UTC seconds since the epoch, with the directives chat templates use.
pub(super) fn strftime(secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    // Civil-from-days (H. Hinnant): proleptic Gregorian calendar from days since 1970-01-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let month_name = MONTHS[(month - 1) as usize];
    let (hour, minute, second) = (tod / 3600, tod % 3600 / 60, tod % 60);

    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match it.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('B') => write!(out, "{month_name}"),
            Some('b') => write!(out, "{}", &month_name[..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", (hour + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('j') => write!(out, "{:03}", doy_in_year(year, month, day)),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

fn doy_in_year(year: i64, month: i64, day: i64) -> i64 {
    const CUMULATIVE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    CUMULATIVE[(month - 1) as usize] + day + i64::from(leap && month > 2)
}

/// Jinja2's `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, each settable. Map keys come out in their order
/// (minijinja's `preserve_order`), as Python's dicts keep theirs.
pub(super) fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    // Python's defaults: ", " between items (bare "," when indenting), ": " after keys.
    let mut item_sep = if indent.is_some() { "," } else { ", " }.to_string();
    let mut key_sep = ": ".to_string();
    if let Some(seps) = separators.filter(|s| !s.is_none()) {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        match parts.as_slice() {
            [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                item_sep = item.to_string();
                key_sep = key.to_string();
            }
            _ => {
                return Err(JinjaError::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be (item_separator, key_separator)",
                ));
            }
        }
    }
    let mut out = String::new();
    let json = Json {
        indent,
        sort_keys,
        ensure_ascii,
        item_sep,
        key_sep,
    };
    json.write(&value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// How `tojson` was asked to write.
struct Json {
    indent: Option<usize>,
    sort_keys: bool,
    /// Non-ASCII characters as `\uXXXX` escapes (UTF-16, as Python writes them).
    ensure_ascii: bool,
    item_sep: String,
    key_sep: String,
}

impl Json {
    fn string(&self, s: &str, out: &mut String) -> Result<(), JinjaError> {
        let quoted = serde_json::to_string(s)
            .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, e.to_string()))?;
        if !self.ensure_ascii {
            out.push_str(&quoted);
            return Ok(());
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
        Ok(())
    }

    fn write(&self, v: &Value, level: usize, out: &mut String) -> Result<(), JinjaError> {
        let indent = self.indent;
        let newline = |out: &mut String, level: usize| {
            if let Some(n) = indent {
                out.push('\n');
                out.push_str(&" ".repeat(n * level));
            }
        };
        let item_sep = self.item_sep.as_str();
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => match v.as_i64() {
                Some(i) if v.is_integer() => {
                    let _ = write!(out, "{i}");
                }
                _ => {
                    let f = f64::try_from(v.clone())?;
                    match serde_json::Number::from_f64(f) {
                        Some(n) => out.push_str(&n.to_string()),
                        None if f.is_nan() => out.push_str("NaN"),
                        None if f < 0.0 => out.push_str("-Infinity"),
                        None => out.push_str("Infinity"),
                    }
                }
            },
            ValueKind::String => self.string(v.as_str().unwrap_or_default(), out)?,
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, key) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(item_sep);
                    }
                    newline(out, level + 1);
                    self.string(&key.to_string(), out)?;
                    out.push_str(&self.key_sep);
                    self.write(&v.get_item(key)?, level + 1, out)?;
                }
                newline(out, level);
                out.push('}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(item_sep);
                    }
                    newline(out, level + 1);
                    self.write(item, level + 1, out)?;
                }
                newline(out, level);
                out.push(']');
            }
            other => {
                return Err(JinjaError::new(
                    ErrorKind::InvalidOperation,
                    format!("cannot convert {other} to JSON"),
                ));
            }
        }
        Ok(())
    }
}

/// The Python `str` and `dict` methods HF templates call (`content.strip()`, `s.startswith(..)`,
/// `d.items()`), which minijinja leaves to the embedder.
pub(super) fn py_method(
    _state: &mut State,
    value: &Value,
    name: &str,
    args: &[Value],
) -> Result<Value, JinjaError> {
    let arg_str = |i: usize| args.get(i).and_then(Value::as_str);
    if let Some(s) = value.as_str() {
        let set = arg_str(0);
        let trim = |c: char| set.map_or(c.is_whitespace(), |set| set.contains(c));
        let affix = |check: &dyn Fn(&str) -> bool| -> Result<bool, JinjaError> {
            match args.first() {
                Some(a) if a.kind() == ValueKind::Seq => {
                    Ok(a.try_iter()?.any(|p| p.as_str().is_some_and(check)))
                }
                Some(a) => Ok(a.as_str().is_some_and(check)),
                None => Err(JinjaError::from(ErrorKind::MissingArgument)),
            }
        };
        return Ok(match name {
            "strip" => s.trim_matches(trim).into(),
            "lstrip" => s.trim_start_matches(trim).into(),
            "rstrip" => s.trim_end_matches(trim).into(),
            "startswith" => affix(&|p| s.starts_with(p))?.into(),
            "endswith" => affix(&|p| s.ends_with(p))?.into(),
            "upper" => s.to_uppercase().into(),
            "lower" => s.to_lowercase().into(),
            "replace" => match (arg_str(0), arg_str(1)) {
                (Some(from), Some(to)) => s.replace(from, to).into(),
                _ => return Err(JinjaError::from(ErrorKind::MissingArgument)),
            },
            "split" => {
                let max = args.get(1).and_then(Value::as_i64).filter(|m| *m >= 0);
                let parts: Vec<Value> = match (arg_str(0), max) {
                    (Some(sep), Some(m)) => {
                        s.splitn(m as usize + 1, sep).map(Value::from).collect()
                    }
                    (Some(sep), None) => s.split(sep).map(Value::from).collect(),
                    (None, _) => s.split_whitespace().map(Value::from).collect(),
                };
                parts.into()
            }
            "find" => match arg_str(0).and_then(|p| s.find(p)) {
                Some(byte) => Value::from(s[..byte].chars().count()),
                None => Value::from(-1),
            },
            "count" => match arg_str(0) {
                Some(p) if !p.is_empty() => Value::from(s.matches(p).count()),
                _ => return Err(JinjaError::from(ErrorKind::MissingArgument)),
            },
            "join" => {
                let items: Vec<String> = match args.first() {
                    Some(a) => a.try_iter()?.map(|v| v.to_string()).collect(),
                    None => return Err(JinjaError::from(ErrorKind::MissingArgument)),
                };
                items.join(s).into()
            }
            "isdigit" => (!s.is_empty() && s.chars().all(|c| c.is_ascii_digit())).into(),
            "isspace" => (!s.is_empty() && s.chars().all(char::is_whitespace)).into(),
            _ => return Err(JinjaError::from(ErrorKind::UnknownMethod)),
        });
    }
    if value.kind() == ValueKind::Map {
        let keys = || -> Result<Vec<Value>, JinjaError> { Ok(value.try_iter()?.collect()) };
        return Ok(match name {
            "keys" => keys()?.into(),
            "values" => keys()?
                .iter()
                .map(|k| value.get_item(k))
                .collect::<Result<Vec<_>, _>>()?
                .into(),
            "items" => keys()?
                .into_iter()
                .map(|k| {
                    let v = value.get_item(&k)?;
                    Ok(Value::from(vec![k, v]))
                })
                .collect::<Result<Vec<_>, JinjaError>>()?
                .into(),
            "get" => {
                let key = args
                    .first()
                    .ok_or_else(|| JinjaError::from(ErrorKind::MissingArgument))?;
                match value.get_item(key)? {
                    v if v.is_undefined() => args.get(1).cloned().unwrap_or(Value::from(())),
                    v => v,
                }
            }
            _ => return Err(JinjaError::from(ErrorKind::UnknownMethod)),
        });
    }
    Err(JinjaError::from(ErrorKind::UnknownMethod))
}
