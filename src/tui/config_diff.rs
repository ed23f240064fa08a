//! What differs between the configs of runs drawn together: the first thing to know when their
//! curves part ways. Configs are compared as their resolved JSON, key path by key path.

use std::collections::BTreeMap;

/// Keys that differ between runs by nature, not by choice.
const IGNORED: [&str; 2] = ["name", "output_dir"];

/// `config_json` flattened to `a.b.c` → value text. A list of objects is walked item by item,
/// each named by its `name` when it has one (`data.domains[add].synthetic.count`), else by its
/// index; a list of plain values stays whole.
fn flatten(config_json: &str) -> BTreeMap<String, String> {
    fn walk(v: &serde_json::Value, path: String, out: &mut BTreeMap<String, String>) {
        match v {
            serde_json::Value::Array(items) if items.iter().any(|i| i.is_object()) => {
                for (i, item) in items.iter().enumerate() {
                    let label = item
                        .get("name")
                        .and_then(|n| n.as_str())
                        .map_or_else(|| i.to_string(), str::to_string);
                    walk(item, format!("{path}[{label}]"), out);
                }
            }
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(v, p, out);
                }
            }
            serde_json::Value::String(s) => {
                out.insert(path, s.clone());
            }
            other => {
                out.insert(path, other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(config_json) {
        walk(&v, String::new(), &mut out);
    }
    out
}

/// Each key whose value is not the same in every config, as `key a vs b` (`-` where a config
/// lacks it), in key order. Configs that cannot be read compare as empty.
pub fn differences(configs: &[&str]) -> Vec<String> {
    let flat: Vec<BTreeMap<String, String>> = configs.iter().map(|c| flatten(c)).collect();
    let mut keys: Vec<&String> = flat.iter().flat_map(|f| f.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| !IGNORED.contains(&k.as_str()))
        .filter_map(|k| {
            let values: Vec<&str> = flat
                .iter()
                .map(|f| f.get(k).map_or("-", String::as_str))
                .collect();
            values
                .iter()
                .any(|v| *v != values[0])
                .then(|| format!("{k} {}", values.join(" vs ")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_keys_that_differ_are_listed() {
        let a = r#"{"name": "a", "seed": 1, "rl": {"kl": {"coef": 0.01, "mode": "in_loss"}, "steps": 150}}"#;
        let b = r#"{"name": "b", "seed": 2, "rl": {"kl": {"coef": 0.05, "mode": "in_loss"}, "steps": 150, "critic": {"lr": 0.1}}}"#;
        assert_eq!(
            differences(&[a, b]),
            [
                "rl.critic.lr - vs 0.1",
                "rl.kl.coef 0.01 vs 0.05",
                "seed 1 vs 2"
            ]
        );
        assert!(differences(&[a, a]).is_empty());
    }

    /// A list of domains differs item by item, each named: not as the whole list's JSON.
    #[test]
    fn lists_of_objects_differ_by_item() {
        let a = r#"{"data": {"domains": [{"name": "add", "synthetic": {"count": 64}}, {"name": "rev", "synthetic": {"count": 64}}]}, "sft": {"stop": ["END", "."]}}"#;
        let b = r#"{"data": {"domains": [{"name": "add", "synthetic": {"count": 64}}, {"name": "rev", "synthetic": {"count": 128}}]}, "sft": {"stop": ["END"]}}"#;
        assert_eq!(
            differences(&[a, b]),
            [
                "data.domains[rev].synthetic.count 64 vs 128",
                r#"sft.stop ["END","."] vs ["END"]"#
            ]
        );
    }
}
