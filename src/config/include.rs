//! `include:` — a config made of reusable fragments (model shapes, worker placements, data and
//! reward definitions in `configs/`).
//!
//! A file may start with `include: [a.yaml, b.yaml]` (paths relative to that file). The fragments
//! are read in order, each merged over the ones before, and the file itself last: mappings merge
//! key by key, anything else (a number, a string, a list) is replaced whole. A fragment may include
//! others; a cycle is an error naming it. The merged document is then read exactly like a single
//! file, and an error in it names the file and line the offending key came from.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::load::{ConfigError, from_yaml_str, yaml_context};

const INCLUDE: &str = "include";

/// Where each key of the merged document was written: its key path, file and 1-based line. Later
/// entries win (they were merged later).
#[derive(Debug, Default)]
struct Origins {
    /// Key paths as each file's lines write them.
    lines: Vec<(Vec<String>, PathBuf, u64)>,
    /// Which file supplied each merged value (flow-style lines name only their outer key, so
    /// ownership is recorded while merging, not read off the text).
    owners: Vec<(Vec<String>, PathBuf)>,
}

impl Origins {
    fn record(&mut self, file: &Path, text: &str) {
        for (i, _) in text.lines().enumerate() {
            let line = i as u64 + 1;
            let (own, mut path) = yaml_context(text, line);
            if let Some(own) = own {
                path.push(own);
                self.lines.push((path, file.to_path_buf(), line));
            }
        }
    }

    /// The file that supplied `path` (or its closest supplied ancestor), and the line in it that
    /// writes `path` or its closest written ancestor.
    fn of(&self, path: &[String]) -> Option<(&Path, u64)> {
        let owner = (0..=path.len()).rev().find_map(|n| {
            self.owners
                .iter()
                .rev()
                .find(|(p, _)| p.as_slice() == &path[..n])
                .map(|(_, f)| f.as_path())
        })?;
        (0..=path.len()).rev().find_map(|n| {
            self.lines
                .iter()
                .rev()
                .find(|(p, f, _)| f == owner && p.as_slice() == &path[..n])
                .map(|(_, f, l)| (f.as_path(), *l))
        })
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.display().to_string(),
        source,
    })
}

/// The `include:` list of a document, as paths relative to `file`'s directory.
fn includes_of(doc: &mut Value, file: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let bad = |message: String| ConfigError::Parse {
        file: file.display().to_string(),
        line: None,
        message,
    };
    let Some(list) = doc.as_object_mut().and_then(|m| m.remove(INCLUDE)) else {
        return Ok(vec![]);
    };
    let items = match list {
        Value::Array(items) => items,
        Value::String(one) => vec![Value::String(one)],
        other => {
            return Err(bad(format!(
                "'include' must be a list of file paths, got {other}"
            )));
        }
    };
    let base = file.parent().unwrap_or(Path::new(""));
    items
        .into_iter()
        .map(|item| match item {
            Value::String(p) => Ok(base.join(p)),
            other => Err(bad(format!("'include' lists file paths, got {other}"))),
        })
        .collect()
}

/// Merge `over` (from `file`) into `base`: mappings key by key, anything else replaced; each
/// value taken from `over` is recorded as `file`'s, at its key path `at`.
fn merge(base: &mut Value, over: Value, at: &mut Vec<String>, file: &Path, origins: &mut Origins) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                at.push(k.clone());
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v, at, file, origins),
                    None => {
                        origins.owners.push((at.clone(), file.to_path_buf()));
                        b.insert(k, v);
                    }
                }
                at.pop();
            }
        }
        (slot, v) => {
            origins.owners.push((at.clone(), file.to_path_buf()));
            *slot = v;
        }
    }
}

/// Read `file` and, first, everything it includes, merging into `merged`. `chain` is the include
/// path that led here (for cycles).
fn gather(
    file: &Path,
    chain: &mut Vec<PathBuf>,
    merged: &mut Value,
    origins: &mut Origins,
) -> Result<(), ConfigError> {
    // The real path, so that `a/../b.yaml` and `b.yaml` are one file (a missing file is reported
    // by the read below).
    let key = std::fs::canonicalize(file)
        .or_else(|_| std::path::absolute(file))
        .unwrap_or_else(|_| file.to_path_buf());
    if chain.contains(&key) {
        let names: Vec<String> = chain
            .iter()
            .chain([&key])
            .map(|p| format!("'{}'", p.display()))
            .collect();
        return Err(ConfigError::Parse {
            file: file.display().to_string(),
            line: None,
            message: format!("include cycle: {}", names.join(" includes ")),
        });
    }
    let text = read(file)?;
    let mut doc: Value = from_yaml_str(&text, &file.display().to_string())?;
    if doc.is_null() {
        doc = Value::Object(Map::new());
    }
    if !doc.is_object() {
        return Err(ConfigError::Parse {
            file: file.display().to_string(),
            line: None,
            message: "a config file must be a mapping of keys".into(),
        });
    }
    // A fragment's dataset paths are relative to the fragment, so a data fragment means the same
    // files whichever config includes it (the top file's are rebased by `RunConfig::load`).
    if !chain.is_empty() {
        rebase_dataset_paths(&mut doc, file.parent().unwrap_or(Path::new("")));
    }
    chain.push(key);
    for inc in includes_of(&mut doc, file)? {
        gather(&inc, chain, merged, origins)?;
    }
    chain.pop();
    origins.record(file, &text);
    merge(merged, doc, &mut vec![], file, origins);
    Ok(())
}

/// Each relative dataset path of `doc` (`data.domains[].path` and `val_path`, `dpo.data`,
/// `dpo.eval.data`) made
/// absolute against `dir`.
fn rebase_dataset_paths(doc: &mut Value, dir: &Path) {
    let domains = doc
        .pointer_mut("/data/domains")
        .and_then(Value::as_array_mut);
    for domain in domains.into_iter().flatten() {
        for key in ["path", "val_path"] {
            if let Some(Value::String(p)) = domain.get_mut(key)
                && Path::new(p.as_str()).is_relative()
            {
                let joined = dir.join(p.as_str());
                let absolute = std::path::absolute(&joined).unwrap_or(joined);
                *p = absolute.display().to_string();
            }
        }
    }
    for pointer in ["/dpo/data", "/dpo/eval/data"] {
        if let Some(Value::String(p)) = doc.pointer_mut(pointer)
            && Path::new(p.as_str()).is_relative()
        {
            let joined = dir.join(p.as_str());
            let absolute = std::path::absolute(&joined).unwrap_or(joined);
            *p = absolute.display().to_string();
        }
    }
}

/// Whether `text` (a YAML document) has a top-level `include:` key.
fn has_includes(text: &str) -> bool {
    text.lines().any(|l| {
        l.strip_prefix(INCLUDE)
            .is_some_and(|rest| rest.trim_start().starts_with(':'))
    })
}

/// Read `path` strictly into `T`, merging the fragments it includes first. A file without
/// `include:` is read as it is.
pub fn load_with_includes<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = read(path)?;
    if !has_includes(&text) {
        return from_yaml_str(&text, &path.display().to_string());
    }
    let (mut merged, mut origins) = (Value::Object(Map::new()), Origins::default());
    gather(path, &mut vec![], &mut merged, &mut origins)?;
    let merged_text = serde_saphyr::to_string(&merged).map_err(|e| ConfigError::Parse {
        file: path.display().to_string(),
        line: None,
        message: format!("merging its includes: {e}"),
    })?;
    from_yaml_str(&merged_text, "<merged>").map_err(|e| match e {
        // Put the error where the offending key was written.
        ConfigError::Parse {
            line: Some(line),
            message,
            ..
        } => {
            let (own, mut key_path) = yaml_context(&merged_text, line);
            key_path.extend(own);
            let (file, line) = match origins.of(&key_path) {
                Some((f, l)) => (f.display().to_string(), Some(l)),
                None => (path.display().to_string(), None),
            };
            ConfigError::Parse {
                file,
                line,
                message,
            }
        }
        ConfigError::Parse { message, .. } => ConfigError::Parse {
            file: path.display().to_string(),
            line: None,
            message,
        },
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        name: String,
        model: Model,
        #[serde(default)]
        tags: Vec<String>,
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Model {
        hidden: u32,
        layers: u32,
        #[serde(default)]
        chars: String,
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("dir");
        }
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn later_files_override_earlier_ones_and_the_file_itself_wins() {
        let dir = tempfile::tempdir().expect("dir");
        write(
            dir.path(),
            "configs/shape.yaml",
            "model:\n  hidden: 64\n  layers: 2\n  chars: \"0123\"\ntags: [a, b]\n",
        );
        write(dir.path(), "configs/deeper.yaml", "model:\n  layers: 4\n");
        let main = write(
            dir.path(),
            "exp/run.yaml",
            "include: [../configs/shape.yaml, ../configs/deeper.yaml]\nname: r\nmodel:\n  hidden: 128\ntags: [c]\n",
        );
        let doc: Doc = load_with_includes(&main).expect("merged");
        assert_eq!(
            doc,
            Doc {
                name: "r".into(),
                // hidden from the file itself, layers from the later fragment, chars from the first;
                // the list is replaced whole.
                model: Model {
                    hidden: 128,
                    layers: 4,
                    chars: "0123".into()
                },
                tags: vec!["c".into()],
            }
        );
    }

    #[test]
    fn an_error_names_the_fragment_and_line_the_key_came_from() {
        let dir = tempfile::tempdir().expect("dir");
        let frag = write(
            dir.path(),
            "shape.yaml",
            "model:\n  hidden: 64\n  layres: 2\n",
        );
        let main = write(
            dir.path(),
            "run.yaml",
            "include: [shape.yaml]\nname: r\nmodel:\n  layers: 1\n",
        );
        let err = load_with_includes::<Doc>(&main)
            .expect_err("a typo")
            .to_string();
        assert!(
            err.starts_with(&format!(
                "config '{}' line 3: unknown field 'layres'",
                frag.display()
            )),
            "{err}"
        );
        assert!(err.contains("(did you mean 'layers'?)"), "{err}");
        // A flow-style value in the file itself, over a block-style fragment, names the file itself.
        let main = write(
            dir.path(),
            "run.yaml",
            "include: [shape.yaml]\nname: r\nmodel: { layers: lots }\n",
        );
        std::fs::write(&frag, "model:\n  hidden: 64\n  layers: 2\n").expect("write");
        let err = load_with_includes::<Doc>(&main)
            .expect_err("a bad value")
            .to_string();
        assert!(
            err.starts_with(&format!(
                "config '{}' line 3: invalid value",
                main.display()
            )),
            "{err}"
        );
        // A wrong value in the file itself names the file itself.
        let main = write(
            dir.path(),
            "run.yaml",
            "include: [shape.yaml]\nname: r\nmodel:\n  layers: many\n",
        );
        std::fs::write(&frag, "model:\n  hidden: 64\n").expect("write");
        let err = load_with_includes::<Doc>(&main)
            .expect_err("a bad value")
            .to_string();
        assert!(
            err.starts_with(&format!(
                "config '{}' line 4: invalid value 'many'",
                main.display()
            )),
            "{err}"
        );
    }

    #[test]
    fn missing_fragments_cycles_and_bad_lists_are_clear_errors() {
        let dir = tempfile::tempdir().expect("dir");
        let main = write(dir.path(), "run.yaml", "include: [nope.yaml]\nname: r\n");
        let err = load_with_includes::<Doc>(&main)
            .expect_err("missing")
            .to_string();
        assert!(
            err.contains("nope.yaml") && err.contains("cannot read"),
            "{err}"
        );
        write(dir.path(), "a.yaml", "include: [sub/b.yaml]\n");
        write(dir.path(), "sub/b.yaml", "include: [../a.yaml]\n");
        let main = write(dir.path(), "run.yaml", "include: [a.yaml]\nname: r\n");
        let err = load_with_includes::<Doc>(&main)
            .expect_err("cycle")
            .to_string();
        assert!(
            err.contains("include cycle:") && err.contains("b.yaml' includes"),
            "{err}"
        );
        assert!(!err.contains("cannot read"), "{err}");
        let main = write(dir.path(), "run.yaml", "include: 3\nname: r\n");
        let err = load_with_includes::<Doc>(&main)
            .expect_err("bad")
            .to_string();
        assert!(
            err.contains("'include' must be a list of file paths"),
            "{err}"
        );
    }
}
