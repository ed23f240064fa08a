//! The workbench's config file: key bindings and colours. It lives at `$ROLL_TUI_CONFIG`, else
//! `$XDG_CONFIG_HOME/roll-tui/workbench.yaml`, else `~/.config/roll-tui/workbench.yaml`; without
//! one the defaults apply. A binding names a view (`global`, `runs`, `dashboard`, `samples`,
//! `workers`, `events`, `episodes`, `debugger`), an action (as the palette and `Action::name` spell it) and its keys,
//! which replace that action's default keys in that view:
//!
//! ```yaml
//! keys:
//!   dashboard: { zoom_in: ["+", "ctrl-up"], expand: "x" }
//!   global: { quit: ["q", "ctrl-c", "ctrl-q"] }
//! theme: { accent: cyan, good: green, bad: lightred, series: [blue, magenta, "#ff8800"] }
//! ```
//!
//! A mistake is an error that names the file and the entry; the workbench does not start half
//! configured.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crossterm::event::{KeyCode, KeyModifiers};
use ratatui::style::Color;
use serde::Deserialize;

use super::action::{Action, Binding, DEFAULT_KEYS, Scope, key_name};
use super::theme::Theme;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    keys: BTreeMap<String, BTreeMap<String, Keys>>,
    #[serde(default)]
    theme: ThemeFile,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Keys {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ThemeFile {
    accent: Option<String>,
    good: Option<String>,
    bad: Option<String>,
    series: Option<Vec<String>>,
}

/// Where the config file is looked for.
pub fn config_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ROLL_TUI_CONFIG") {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("roll-tui").join("workbench.yaml"))
}

/// The keymap and theme from `path`; the defaults when it is `None` or, unless `required`, absent.
pub fn load(path: Option<&Path>, required: bool) -> Result<(Vec<Binding>, Theme), String> {
    let defaults = (DEFAULT_KEYS.to_vec(), Theme::default());
    let Some(path) = path else {
        return Ok(defaults);
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => return Ok(defaults),
        Err(e) => return Err(format!("workbench config '{}': {e}", path.display())),
    };
    let origin = path.display().to_string();
    let file: File =
        crate::config::load::from_yaml_str(&text, &origin).map_err(|e| e.to_string())?;
    let keys = apply_keys(&file.keys).map_err(|e| format!("workbench config '{origin}': {e}"))?;
    let theme =
        apply_theme(&file.theme).map_err(|e| format!("workbench config '{origin}': {e}"))?;
    Ok((keys, theme))
}

/// The defaults with the file's bindings applied. A key the file binds in a view is taken from
/// whichever default used it there (a file written for an older keymap keeps working when a new
/// default lands on one of its keys); two of the file's own bindings on one key are an error.
fn apply_keys(file: &BTreeMap<String, BTreeMap<String, Keys>>) -> Result<Vec<Binding>, String> {
    let mut keys = DEFAULT_KEYS.to_vec();
    let mut given: Vec<Binding> = vec![];
    for (scope_name, actions) in file {
        let scope = Scope::ALL
            .into_iter()
            .find(|s| s.name() == scope_name)
            .ok_or_else(|| {
                let names: Vec<_> = Scope::ALL.iter().map(|s| s.name()).collect();
                format!(
                    "keys.{scope_name}: no such view (one of {})",
                    names.join(", ")
                )
            })?;
        for (action_name, list) in actions {
            let action = Action::from_name(action_name).ok_or_else(|| {
                let names: Vec<String> = Action::ALL.iter().map(|a| a.name()).collect();
                let hint = crate::config::load::did_you_mean(
                    action_name,
                    names.iter().map(String::as_str),
                )
                .map(|n| format!(" (did you mean '{n}'?)"))
                .unwrap_or_default();
                format!("keys.{scope_name}.{action_name}: no such action{hint}")
            })?;
            let strings = match list {
                Keys::One(k) => vec![k.clone()],
                Keys::Many(ks) => ks.clone(),
            };
            keys.retain(|b| !(b.scope == scope && b.action == action));
            for k in &strings {
                let (code, modifiers) = parse_key(k)
                    .map_err(|e| format!("keys.{scope_name}.{action_name}: '{k}': {e}"))?;
                given.push(Binding {
                    code,
                    modifiers,
                    scope,
                    action,
                });
            }
        }
    }
    keys.retain(|d| {
        !given
            .iter()
            .any(|g| g.scope == d.scope && g.code == d.code && g.modifiers == d.modifiers)
    });
    keys.extend(given);
    check_conflicts(&keys)?;
    Ok(keys)
}

/// Two actions on one key in one view would make one of them unreachable: refuse it.
fn check_conflicts(keys: &[Binding]) -> Result<(), String> {
    for (i, a) in keys.iter().enumerate() {
        if let Some(b) = keys[i + 1..].iter().find(|b| {
            b.scope == a.scope
                && b.code == a.code
                && b.modifiers == a.modifiers
                && b.action != a.action
        }) {
            return Err(format!(
                "key '{}' is bound to both '{}' and '{}' in {}: rebind one of them",
                key_name(a),
                a.action.name(),
                b.action.name(),
                a.scope.name()
            ));
        }
    }
    Ok(())
}

/// `q`, `G`, `ctrl-d`, `enter`, `esc`, `tab`, `shift-tab`, `space`, arrows, `pgup`, `f5`…
pub fn parse_key(text: &str) -> Result<(KeyCode, KeyModifiers), String> {
    let mut modifiers = KeyModifiers::NONE;
    let mut rest = text;
    loop {
        let lower = rest.to_ascii_lowercase();
        if rest.chars().count() > 1 && lower.starts_with("ctrl-") {
            modifiers |= KeyModifiers::CONTROL;
            rest = &rest[5..];
        } else if rest.chars().count() > 1 && lower.starts_with("alt-") {
            modifiers |= KeyModifiers::ALT;
            rest = &rest[4..];
        } else {
            break;
        }
    }
    let mut chars = rest.chars();
    let code = match (chars.next(), chars.next()) {
        (Some(c), None) => KeyCode::Char(c),
        _ => match rest.to_ascii_lowercase().as_str() {
            "enter" | "return" => KeyCode::Enter,
            "esc" | "escape" => KeyCode::Esc,
            "tab" => KeyCode::Tab,
            "shift-tab" | "backtab" => KeyCode::BackTab,
            "space" => KeyCode::Char(' '),
            "backspace" => KeyCode::Backspace,
            "up" => KeyCode::Up,
            "down" => KeyCode::Down,
            "left" => KeyCode::Left,
            "right" => KeyCode::Right,
            "pgup" | "pageup" => KeyCode::PageUp,
            "pgdn" | "pagedown" => KeyCode::PageDown,
            "home" => KeyCode::Home,
            "end" => KeyCode::End,
            "delete" | "del" => KeyCode::Delete,
            other => match other.strip_prefix('f').and_then(|n| n.parse::<u8>().ok()) {
                Some(n) if (1..=12).contains(&n) => KeyCode::F(n),
                _ => return Err("not a key (e.g. q, ctrl-d, enter, shift-tab, pgup, f5)".into()),
            },
        },
    };
    Ok((code, modifiers))
}

fn colour(field: &str, text: &str) -> Result<Color, String> {
    text.parse::<Color>().map_err(|_| {
        format!("theme.{field}: '{text}' is not a colour (a name like cyan, or #rrggbb)")
    })
}

fn apply_theme(file: &ThemeFile) -> Result<Theme, String> {
    let mut theme = Theme::default();
    if let Some(c) = &file.accent {
        theme.focus_border = theme.focus_border.fg(colour("accent", c)?);
    }
    if let Some(c) = &file.good {
        theme.good = theme.good.fg(colour("good", c)?);
    }
    if let Some(c) = &file.bad {
        theme.bad = theme.bad.fg(colour("bad", c)?);
    }
    if let Some(list) = &file.series {
        if list.is_empty() {
            return Err("theme.series: give at least one colour".into());
        }
        theme.series = list
            .iter()
            .map(|c| colour("series", c))
            .collect::<Result<_, _>>()?;
    }
    Ok(theme)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on failure
mod tests {
    use super::*;
    use crate::tui::action::action_for;
    use crossterm::event::KeyEvent;

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("workbench.yaml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn keys_parse_with_modifiers_and_names() {
        assert_eq!(
            parse_key("q").unwrap(),
            (KeyCode::Char('q'), KeyModifiers::NONE)
        );
        assert_eq!(
            parse_key("G").unwrap(),
            (KeyCode::Char('G'), KeyModifiers::NONE)
        );
        assert_eq!(
            parse_key("-").unwrap(),
            (KeyCode::Char('-'), KeyModifiers::NONE)
        );
        assert_eq!(
            parse_key("ctrl-d").unwrap(),
            (KeyCode::Char('d'), KeyModifiers::CONTROL)
        );
        assert_eq!(
            parse_key("Ctrl-Up").unwrap(),
            (KeyCode::Up, KeyModifiers::CONTROL)
        );
        assert_eq!(
            parse_key("shift-tab").unwrap(),
            (KeyCode::BackTab, KeyModifiers::NONE)
        );
        assert_eq!(
            parse_key("f5").unwrap(),
            (KeyCode::F(5), KeyModifiers::NONE)
        );
        assert!(parse_key("ctrl-").is_err());
        assert!(parse_key("").is_err());
        assert!(parse_key("hyper-x").is_err());
        assert!(parse_key("f13").is_err());
    }

    #[test]
    fn every_action_name_round_trips() {
        for a in Action::ALL {
            assert_eq!(Action::from_name(&a.name()), Some(a), "{a:?}");
        }
        assert_eq!(Action::ZoomIn.name(), "zoom_in");
        assert_eq!(Action::View(3).name(), "view_3");
        // Every default binding's action can be named in the file.
        for b in DEFAULT_KEYS {
            assert!(Action::ALL.contains(&b.action), "{:?}", b.action);
        }
    }

    #[test]
    fn a_file_rebinds_an_action_in_its_view_and_sets_colours() {
        let (_d, path) = write(
            "keys:\n  dashboard: { zoom_in: [\"+\", \"ctrl-up\"], expand: x }\n\
             theme: { accent: yellow, series: [red, \"#ff8800\"] }\n",
        );
        let (keys, theme) = load(Some(&path), true).unwrap();
        let act = |code, m| action_for(&keys, Scope::Dashboard, &KeyEvent::new(code, m));
        assert_eq!(
            act(KeyCode::Up, KeyModifiers::CONTROL),
            Some(Action::ZoomIn)
        );
        assert_eq!(
            act(KeyCode::Char('x'), KeyModifiers::NONE),
            Some(Action::Expand)
        );
        assert_eq!(
            act(KeyCode::Char('e'), KeyModifiers::NONE),
            None,
            "the default is replaced"
        );
        // `x` was hide_series' default: the file's binding takes it, and hide_series has no key.
        assert!(
            !keys
                .iter()
                .any(|b| b.scope == Scope::Dashboard && b.action == Action::HideSeries)
        );
        assert_eq!(theme.series, vec![Color::Red, Color::Rgb(0xff, 0x88, 0)]);
        assert_eq!(theme.focus_border.fg, Some(Color::Yellow));
    }

    #[test]
    fn mistakes_name_the_file_and_the_entry() {
        let err = |text: &str| {
            let (_d, path) = write(text);
            load(Some(&path), true).unwrap_err()
        };
        let e = err("keys: { dashbord: { quit: q } }\n");
        assert!(e.contains("keys.dashbord: no such view"), "{e}");
        assert!(e.contains("workbench.yaml"), "{e}");
        let e = err("keys: { global: { quitt: q } }\n");
        assert!(
            e.contains("keys.global.quitt: no such action (did you mean 'quit'?)"),
            "{e}"
        );
        let e = err("keys: { global: { quit: hyper-q } }\n");
        assert!(e.contains("keys.global.quit: 'hyper-q'"), "{e}");
        // Two of the file's own bindings on one key; a default on it gives way (tested above).
        let e = err("keys: { dashboard: { expand: \"+\", freeze: \"+\" } }\n");
        assert!(e.contains("bound to both"), "{e}");
        let (_d, path) = write("keys: { dashboard: { expand: \"+\" } }\n");
        assert!(load(Some(&path), true).is_ok());
        let e = err("theme: { good: greenish }\n");
        assert!(e.contains("theme.good: 'greenish'"), "{e}");
        let e = err("colours: {}\n");
        assert!(e.contains("colours"), "{e}");
    }

    #[test]
    fn no_file_means_defaults_unless_it_was_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.yaml");
        let (keys, _) = load(Some(&missing), false).unwrap();
        assert_eq!(keys, DEFAULT_KEYS.to_vec());
        assert!(
            load(Some(&missing), true)
                .unwrap_err()
                .contains("none.yaml")
        );
        assert_eq!(load(None, false).unwrap().0, DEFAULT_KEYS.to_vec());
    }
}
