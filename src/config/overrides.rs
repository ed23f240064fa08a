//! `key.sub=value` command-line overrides, applied to an already typed config and checked against its
//! schema after each one, so that an error names the override that caused it.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::load::{ConfigError, did_you_mean, expected_suffix, strip_location, suggestion_suffix};

/// Applies `key.sub=value` overrides to an already typed config. Each right-hand side is read as a YAML
/// scalar or flow value (`3`, `0.5`, `true`, `grpo`, `[1, 2]`, `null`, `'quoted'`).
pub fn apply_overrides<T: DeserializeOwned + Serialize>(
    value: T,
    overrides: &[String],
) -> Result<T, ConfigError> {
    if overrides.is_empty() {
        return Ok(value);
    }
    let mut tree = serde_json::to_value(&value).map_err(|e| ConfigError::Override {
        arg: overrides[0].clone(),
        message: format!("cannot represent the config as a tree: {e}"),
    })?;
    // Each override is applied to the tree and checked against the schema right away, so a type error
    // names the override that caused it; a bad one is left out and the rest still checked, so that
    // every mistake on the command line is reported at once.
    let mut typed = value;
    let mut bad: Vec<(String, String)> = vec![];
    for arg in overrides {
        match apply_one(&tree, arg) {
            Ok((t, v)) => (tree, typed) = (t, v),
            Err(message) => bad.push((arg.clone(), message)),
        }
    }
    match bad.len() {
        0 => Ok(typed),
        1 => {
            let (arg, message) = bad.remove(0);
            Err(ConfigError::Override { arg, message })
        }
        _ => Err(ConfigError::Overrides { problems: bad }),
    }
}

/// `tree` with the override `arg` applied, and its typed config; or why `arg` cannot apply.
fn apply_one<T: DeserializeOwned>(tree: &Value, arg: &str) -> Result<(Value, T), String> {
    let (path, rhs, plain) = split_override(arg)?;
    let mut tree = tree.clone();
    if let Err(unknown) = set_path(&mut tree, &path, rhs.clone(), plain.clone(), false) {
        // A key the file does not have: welcome in a free-form map (an env's `params`) or in a
        // section given only in part, which the schema decides; a typo stays an error that names
        // the keys there are.
        let mut grown = tree.clone();
        set_path(&mut grown, &path, rhs, plain, true)?;
        return match serde_json::from_value::<T>(grown.clone()) {
            Ok(t) => Ok((grown, t)),
            Err(_) => Err(unknown),
        };
    }
    let typed = serde_json::from_value::<T>(tree.clone())
        .map_err(|e| humanize_json_error(&e.to_string(), &path.join(".")))?;
    Ok((tree, typed))
}

fn split_override(arg: &str) -> Result<(Vec<&str>, Value, Option<String>), String> {
    let Some((key, rhs)) = arg.split_once('=') else {
        return Err("expected 'key.sub=value'".to_string());
    };
    let key = key.trim();
    let path: Vec<&str> = key.split('.').collect();
    if path.iter().any(|s| s.is_empty()) {
        return Err(format!("key '{key}' has an empty segment"));
    }
    let rhs = rhs.trim();
    if rhs.is_empty() {
        return Err("missing value (write null for none, or '' for an empty string)".to_string());
    }
    let value: Value = serde_saphyr::from_str(rhs).map_err(|e| {
        format!(
            "cannot read value '{rhs}': {}",
            strip_location(&e.to_string())
        )
    })?;
    // A bare `123` or `true` given to a string field means its text, as YAML itself would store it
    // in a `String`; keep the text for that case.
    let plain = match value {
        Value::Number(_) | Value::Bool(_) if !rhs.starts_with(['"', '\'']) => Some(rhs.to_string()),
        _ => None,
    };
    Ok((path, value, plain))
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "section",
    }
}

/// Set `path` to `value`; with `create`, keys missing on the way are made (the caller checks the
/// result against the schema).
fn set_path(
    root: &mut Value,
    path: &[&str],
    value: Value,
    plain: Option<String>,
    create: bool,
) -> Result<(), String> {
    let mut cur = root;
    // Inside a section that was absent (an `Option` that was `None`) any key may be created; the
    // schema check after the override reports what does not belong.
    let mut fresh = create;
    for (i, seg) in path.iter().enumerate() {
        let here = path[..i].join(".");
        if cur.is_null() {
            *cur = Value::Object(serde_json::Map::new());
            fresh = true;
        }
        cur = match cur {
            Value::Object(map) => {
                if !map.contains_key(*seg) {
                    if !fresh {
                        return Err(unknown_key(seg, &here, map.keys().map(String::as_str)));
                    }
                    map.insert((*seg).to_string(), Value::Null);
                }
                match map.get_mut(*seg) {
                    Some(v) => v,
                    None => return Err(format!("cannot set '{seg}'")),
                }
            }
            Value::Array(items) => {
                let len = items.len();
                match seg.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                    Some(v) => v,
                    None => {
                        return Err(format!(
                            "'{seg}' is not an index of list '{here}' ({len} items)"
                        ));
                    }
                }
            }
            other => {
                return Err(format!(
                    "'{here}' is a {}, not a section, so it has no key '{seg}'",
                    kind_of(other)
                ));
            }
        };
    }
    *cur = match plain {
        Some(text) if cur.is_string() => Value::String(text),
        _ => value,
    };
    Ok(())
}

fn unknown_key<'a>(seg: &str, here: &str, keys: impl Iterator<Item = &'a str> + Clone) -> String {
    let place = if here.is_empty() {
        String::new()
    } else {
        format!(" in '{here}'")
    };
    match did_you_mean(seg, keys.clone()) {
        Some(s) => format!("unknown key '{seg}'{place} (did you mean '{s}'?)"),
        None => format!(
            "unknown key '{seg}'{place} (known keys: {})",
            keys.collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Rewrites serde_json's "unknown variant `x`, expected one of `a`, `b`" into our quoting style, with a
/// suggestion; other messages pass through.
fn humanize_json_error(msg: &str, key: &str) -> String {
    let ticked = |s: &str| -> Vec<String> {
        s.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    for kind in ["unknown variant", "unknown field"] {
        if let Some(rest) = msg.strip_prefix(kind)
            && let Some((bad, expected)) = rest.split_once(", expected")
            && let Some(bad) = ticked(bad).into_iter().next()
        {
            let expected = ticked(expected);
            let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
            return if kind == "unknown variant" {
                format!(
                    "invalid value '{bad}' for '{key}'{}",
                    expected_suffix(&bad, &expected)
                )
            } else {
                format!(
                    "unknown field '{bad}' in the value for '{key}'{}",
                    suggestion_suffix(&bad, expected)
                )
            };
        }
    }
    // `missing field `data``: a section the override creates lacks a field it needs.
    if let Some(field) = msg
        .strip_prefix("missing field ")
        .and_then(|m| ticked(m).into_iter().next())
    {
        // Which section lacks it, serde does not say: the one the override creates is the
        // likeliest, named as a guess.
        let section = key.rsplit_once('.').map_or(key, |(s, _)| s);
        return format!(
            "setting '{key}' creates a section that lacks '{field}' (likely '{section}'): give \
             the section whole, e.g. '{section}={{…, {field}: …}}', or set it in the file"
        );
    }
    // `invalid type: string "x", expected u64` (or `invalid value: integer `-1`, expected
    // usize`): say the expected type in config terms.
    if let Some((what, ty)) = msg.rsplit_once(", expected ")
        && let Some(found) = what
            .strip_prefix("invalid type: ")
            .or_else(|| what.strip_prefix("invalid value: "))
    {
        let ty = ty.split(" at line").next().unwrap_or(ty);
        // `string "x"` says "x"; `floating point `1.5`` says 1.5; a list or map says what it is.
        let shown = match (found.find('"'), found.split('`').nth(1)) {
            (Some(q), _) => found[q..].to_string(),
            (None, Some(v)) => v.to_string(),
            _ => format!("({found})"),
        };
        return format!(
            "invalid value {shown} for '{key}', expected {}",
            super::load::describe_scalar_type(ty)
        );
    }
    msg.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load::tests::{Estimator, GOOD, Run, err_text};
    use crate::config::load::{from_yaml_str, load_yaml};

    fn ovr(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn overrides_set_nested_scalars_enums_bools_lists_and_null() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.yaml");
        std::fs::write(&path, GOOD).unwrap();
        let run: Run = load_yaml(
            &path,
            &ovr(&[
                "actor_train.learning_rate=0.5",
                "actor_train.batch_size=3",
                "actor_train.warmup_steps=10",
                "algo.adv_estimator=reinforce_plus_plus",
                "algo.whiten=true",
                "seed=7",
                "domains=[a, b, c]",
                "name=123",
            ]),
        )
        .unwrap();
        assert_eq!(run.actor_train.learning_rate, 0.5);
        assert_eq!(run.actor_train.batch_size, 3);
        assert_eq!(run.actor_train.warmup_steps, Some(10));
        assert_eq!(run.algo.adv_estimator, Estimator::ReinforcePlusPlus);
        assert!(run.algo.whiten);
        assert_eq!(run.seed, Some(7));
        assert_eq!(run.domains, vec!["a", "b", "c"]);
        // A bare number given to a string field is its text.
        assert_eq!(run.name, "123");

        let run: Run = load_yaml(
            &path,
            &ovr(&[
                "actor_train.warmup_steps=null",
                "name='quoted'",
                "domains.1=prose",
                "actor_train.learning_rate=1e-6",
            ]),
        )
        .unwrap();
        assert_eq!(run.actor_train.warmup_steps, None);
        assert_eq!(run.name, "quoted");
        assert_eq!(run.domains, vec!["math", "prose"]);
        assert_eq!(run.actor_train.learning_rate, 1e-6);
    }

    #[test]
    fn override_errors_name_the_override() {
        let run: Run = from_yaml_str(GOOD, "x.yaml").unwrap();

        let msg = err_text(apply_overrides(
            run.clone(),
            &ovr(&["actor_train.lerning_rate=1"]),
        ));
        assert_eq!(
            msg,
            "override 'actor_train.lerning_rate=1': unknown key 'lerning_rate' in 'actor_train' \
             (did you mean 'learning_rate'?)"
        );

        let msg = err_text(apply_overrides(
            run.clone(),
            &ovr(&["trian.learning_rate=1"]),
        ));
        assert!(msg.contains("unknown key 'trian' (known keys: "), "{msg}");

        let msg = err_text(apply_overrides(
            run.clone(),
            &ovr(&["actor_train.learning_rate=abc"]),
        ));
        assert!(
            msg.starts_with("override 'actor_train.learning_rate=abc': "),
            "{msg}"
        );
        assert!(msg.contains("abc"), "{msg}");

        let msg = err_text(apply_overrides(
            run.clone(),
            &ovr(&["algo.adv_estimator=gpro"]),
        ));
        assert!(
            msg.starts_with(
                "override 'algo.adv_estimator=gpro': invalid value 'gpro' for 'algo.adv_estimator' \
                 (expected one of: gae, reinforce, grpo, reinforce_plus_plus; did you mean 'grpo'?)"
            ),
            "{msg}"
        );

        let msg = err_text(apply_overrides(run.clone(), &ovr(&["name.first=x"])));
        assert!(msg.contains("'name' is a string, not a section"), "{msg}");

        let msg = err_text(apply_overrides(run.clone(), &ovr(&["seed"])));
        assert!(msg.contains("expected 'key.sub=value'"), "{msg}");

        let msg = err_text(apply_overrides(run, &ovr(&["seed="])));
        assert!(msg.contains("missing value"), "{msg}");
    }
}
