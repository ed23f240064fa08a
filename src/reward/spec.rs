//! A domain's reward as data: one reward kind with its parameters, or a weighted combination of
//! several whose components are kept as each sample's breakdown.
//!
//! In a config (`data.domains[].reward`):
//! ```yaml
//! reward: math_rule                                   # a kind with its default parameters
//! reward: { kind: exact_match, ignore_case: true }    # a kind with parameters
//! reward:                                             # a weighted combination
//!   combine:
//!     - { kind: math_rule, weight: 0.8 }
//!     - { kind: exact_match, weight: 0.2, ignore_case: true }
//! ```
//! [`RewardSpec`] is that text as written (names unchecked, so that a misspelt name is reported
//! with the other validation problems and a suggestion); [`RewardSpec::resolve`] turns it into a
//! [`Reward`], the checked form a score request carries.

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{
    RewardKind, RewardOutcome, Scoring, code_sandbox, exact_match, ifeval, llm_judge, math_rule,
    math_verify, regex_match,
};

/// One term as written: a kind's name, its parameters, and its weight in a combination. The map
/// form of a whole spec is the same type: a term (`kind` set), or `combine` alone (see
/// [`RewardSpec`]'s `Deserialize`), so the two never drift apart.
#[derive(Default, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardTermConfig {
    /// The kind's name (empty in the map form of a `combine` spec).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Weight in a `combine` list (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f32>,
    /// `exact_match`: compare without regard to case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_case: Option<bool>,
    /// `math_verify`: `50\%` also equals `0.5` (default true; it always equals `50`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent_is_fraction: Option<bool>,
    /// `code_sandbox`, `ifeval`: `all` (1 when every test or instruction passes) or `fraction`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scoring: Option<Scoring>,
    /// `ifeval`: `strict` (default) or `loose`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ifeval::Mode>,
    /// `regex_match`: the regular expression a response must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// `llm_judge`: the judge model (a Hugging Face directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<std::path::PathBuf>,
    /// `llm_judge`: the Jinja template (`{{ prompt }}`, `{{ response }}`, `{{ reference }}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// `llm_judge`: `yes_no` (default) or `score`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<llm_judge::Verdict>,
    /// `llm_judge`: the tokens compared by `yes_no` (default "Yes" and "No").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yes: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no: Option<String>,
    /// `llm_judge`: tokens the judge may write for `score` (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<usize>,
    /// `code_sandbox`: wall-clock seconds per run (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// `code_sandbox`: address space per run in MiB (default 512).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Only in the map form of a spec: the terms of a weighted combination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub combine: Option<Vec<RewardTermConfig>>,
}

/// A domain's reward as the config wrote it.
#[derive(Debug, Clone, PartialEq)]
pub enum RewardSpec {
    /// `reward: math_rule`
    Name(String),
    /// `reward: { kind: exact_match, ignore_case: true }`
    Term(Box<RewardTermConfig>),
    /// `reward: { combine: [...] }`
    Combine(Vec<RewardTermConfig>),
}

/// A reward function with its parameters, checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RewardFn {
    MathRule,
    MathVerify { percent_is_fraction: bool },
    CodeSandbox(code_sandbox::Params),
    Ifeval(ifeval::Params),
    RegexMatch { pattern: String },
    LlmJudge(llm_judge::Params),
    ExactMatch { ignore_case: bool },
}

/// What scores a domain's responses, checked: one function, or weighted functions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reward {
    One(RewardFn),
    Weighted(Vec<(RewardFn, f32)>),
}

impl RewardFn {
    pub fn kind(&self) -> RewardKind {
        match self {
            RewardFn::MathRule => RewardKind::MathRule,
            RewardFn::MathVerify { .. } => RewardKind::MathVerify,
            RewardFn::CodeSandbox(_) => RewardKind::CodeSandbox,
            RewardFn::Ifeval(_) => RewardKind::Ifeval,
            RewardFn::RegexMatch { .. } => RewardKind::RegexMatch,
            RewardFn::LlmJudge(_) => RewardKind::LlmJudge,
            RewardFn::ExactMatch { .. } => RewardKind::ExactMatch,
        }
    }

    /// Score `response` against `ground_truth`. `prompt` is the user turn as the dataset gave it
    /// (no reward of this build reads it yet; instruction-following checks will).
    pub fn score(&self, prompt: &str, response: &str, ground_truth: &str) -> RewardOutcome {
        match self {
            RewardFn::MathRule => math_rule::score(response, ground_truth),
            RewardFn::MathVerify {
                percent_is_fraction,
            } => math_verify::score(
                response,
                ground_truth,
                math_verify::Options {
                    percent_is_fraction: *percent_is_fraction,
                },
            ),
            RewardFn::CodeSandbox(params) => code_sandbox::score(response, ground_truth, params),
            RewardFn::Ifeval(params) => ifeval::score(response, ground_truth, params),
            RewardFn::RegexMatch { pattern } => regex_match::score(response, pattern),
            RewardFn::LlmJudge(params) => llm_judge::score(prompt, response, ground_truth, params),
            RewardFn::ExactMatch { ignore_case: false } => {
                exact_match::score(response, ground_truth)
            }
            RewardFn::ExactMatch { ignore_case: true } => {
                exact_match::score(&response.to_lowercase(), &ground_truth.to_lowercase())
            }
        }
    }
}

impl Reward {
    /// The judge terms of this reward (for batching a call's judging, see
    /// [`llm_judge::prejudge`]).
    pub fn judges(&self) -> Vec<&llm_judge::Params> {
        fn one(f: &RewardFn) -> Option<&llm_judge::Params> {
            match f {
                RewardFn::LlmJudge(p) => Some(p),
                _ => None,
            }
        }
        match self {
            Reward::One(f) => one(f).into_iter().collect(),
            Reward::Weighted(terms) => terms.iter().filter_map(|(f, _)| one(f)).collect(),
        }
    }

    /// Whether scoring runs programs (and so needs [`crate::sandbox`]).
    pub fn runs_programs(&self) -> bool {
        let one = |f: &RewardFn| matches!(f, RewardFn::CodeSandbox(_));
        match self {
            Reward::One(f) => one(f),
            Reward::Weighted(terms) => terms.iter().any(|(f, _)| one(f)),
        }
    }

    /// Seconds the reward may spend on one response at worst (its programs' deadlines; 0 for
    /// rule rewards, which take microseconds).
    pub fn worst_case_seconds(&self, ground_truth: &str) -> f64 {
        let one = |f: &RewardFn| match f {
            RewardFn::CodeSandbox(params) => code_sandbox::worst_case_seconds(ground_truth, params),
            _ => 0.0,
        };
        match self {
            Reward::One(f) => one(f),
            Reward::Weighted(terms) => terms.iter().map(|(f, _)| one(f)).sum(),
        }
    }

    /// Score one response. A weighted reward's score is the weighted sum of its terms' scores;
    /// it is correct (and formatted) when every term is; each term's score is a component of the
    /// outcome, named after its kind (`math_rule`, or `math_rule#2` for a repeated kind).
    pub fn score(&self, prompt: &str, response: &str, ground_truth: &str) -> RewardOutcome {
        let terms = match self {
            Reward::One(f) => return f.score(prompt, response, ground_truth),
            Reward::Weighted(terms) => terms,
        };
        let mut out = RewardOutcome {
            score: 0.0,
            correct: true,
            format_ok: true,
            extracted: None,
            components: vec![],
            error: None,
        };
        for (i, (f, weight)) in terms.iter().enumerate() {
            let part = f.score(prompt, response, ground_truth);
            out.score += weight * part.score;
            out.correct &= part.correct;
            out.format_ok &= part.format_ok;
            out.extracted = out.extracted.or(part.extracted);
            out.error = out.error.or(part.error);
            let kind = f.kind().as_str();
            let repeats = terms[..i]
                .iter()
                .filter(|(g, _)| g.kind() == f.kind())
                .count();
            let name = match repeats {
                0 => kind.to_string(),
                n => format!("{kind}#{}", n + 1),
            };
            out.components.push((name, part.score));
        }
        out
    }
}

fn suggest(name: &str) -> String {
    let best = RewardKind::ALL
        .iter()
        .map(|k| (strsim::jaro_winkler(name, k.as_str()), k.as_str()))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match best {
        Some((score, k)) if score > 0.7 => format!(" (did you mean '{k}'?)"),
        _ => String::new(),
    }
}

fn resolve_term(t: &RewardTermConfig, at: &str) -> Result<RewardFn, String> {
    if t.combine.is_some() {
        return Err(format!(
            "{at}: 'combine' belongs at the top of a reward, not inside a term"
        ));
    }
    if t.kind.is_empty() {
        return Err(format!("{at}: a reward term needs 'kind'"));
    }
    let Some(kind) = RewardKind::ALL.into_iter().find(|k| k.as_str() == t.kind) else {
        let known: Vec<&str> = RewardKind::ALL.iter().map(|k| k.as_str()).collect();
        return Err(format!(
            "{at}: unknown reward '{}'{} (known: {})",
            t.kind,
            suggest(&t.kind),
            known.join(", ")
        ));
    };
    let misplaced = |param: &str, owner: &str| {
        Err(format!(
            "{at}: '{param}' is a parameter of {owner}, not of {}",
            kind.as_str()
        ))
    };
    if t.ignore_case.is_some() && kind != RewardKind::ExactMatch {
        return misplaced("ignore_case", "exact_match");
    }
    if t.percent_is_fraction.is_some() && kind != RewardKind::MathVerify {
        return misplaced("percent_is_fraction", "math_verify");
    }
    for (param, given) in [
        ("timeout_s", t.timeout_s.is_some()),
        ("memory_mb", t.memory_mb.is_some()),
    ] {
        if given && kind != RewardKind::CodeSandbox {
            return misplaced(param, "code_sandbox");
        }
    }
    if t.scoring.is_some() && !matches!(kind, RewardKind::CodeSandbox | RewardKind::Ifeval) {
        return misplaced("scoring", "code_sandbox and ifeval");
    }
    if t.mode.is_some() && kind != RewardKind::Ifeval {
        return misplaced("mode", "ifeval");
    }
    if t.pattern.is_some() && kind != RewardKind::RegexMatch {
        return misplaced("pattern", "regex_match");
    }
    for (param, given) in [
        ("model", t.model.is_some()),
        ("template", t.template.is_some()),
        ("verdict", t.verdict.is_some()),
        ("yes", t.yes.is_some()),
        ("no", t.no.is_some()),
        ("max_new_tokens", t.max_new_tokens.is_some()),
    ] {
        if given && kind != RewardKind::LlmJudge {
            return misplaced(param, "llm_judge");
        }
    }
    Ok(match kind {
        RewardKind::MathRule => RewardFn::MathRule,
        RewardKind::MathVerify => RewardFn::MathVerify {
            percent_is_fraction: t.percent_is_fraction.unwrap_or(true),
        },
        RewardKind::ExactMatch => RewardFn::ExactMatch {
            ignore_case: t.ignore_case.unwrap_or(false),
        },
        RewardKind::CodeSandbox => {
            let defaults = code_sandbox::Params::default();
            let timeout_s = t.timeout_s.unwrap_or(defaults.timeout_s);
            if !(timeout_s > 0.0 && timeout_s <= 600.0) {
                return Err(format!(
                    "{at}: timeout_s must be in (0, 600] seconds, got {timeout_s}"
                ));
            }
            let memory_mb = t.memory_mb.unwrap_or(defaults.memory_mb);
            if !(16..=65_536).contains(&memory_mb) {
                return Err(format!(
                    "{at}: memory_mb must be in 16..=65536, got {memory_mb}"
                ));
            }
            RewardFn::CodeSandbox(code_sandbox::Params {
                scoring: t.scoring.unwrap_or(defaults.scoring),
                timeout_s,
                memory_mb,
            })
        }
        RewardKind::Ifeval => RewardFn::Ifeval(ifeval::Params {
            mode: t.mode.unwrap_or_default(),
            scoring: t.scoring.unwrap_or_default(),
        }),
        RewardKind::RegexMatch => {
            let Some(pattern) = &t.pattern else {
                return Err(format!(
                    "{at}: regex_match needs 'pattern' (a regular expression)"
                ));
            };
            regex_match::compile(pattern).map_err(|e| format!("{at}.pattern: {e}"))?;
            RewardFn::RegexMatch {
                pattern: pattern.clone(),
            }
        }
        RewardKind::LlmJudge => {
            let Some(model) = &t.model else {
                return Err(format!(
                    "{at}: llm_judge needs 'model' (a Hugging Face directory)"
                ));
            };
            let defaults = llm_judge::Params::new(model.clone());
            let params = llm_judge::Params {
                model: model.clone(),
                template: t.template.clone().unwrap_or(defaults.template),
                verdict: t.verdict.unwrap_or_default(),
                yes: t.yes.clone().unwrap_or(defaults.yes),
                no: t.no.clone().unwrap_or(defaults.no),
                max_new_tokens: t.max_new_tokens.unwrap_or(defaults.max_new_tokens),
            };
            if !(1..=512).contains(&params.max_new_tokens) {
                return Err(format!(
                    "{at}: max_new_tokens must be in 1..=512, got {}",
                    params.max_new_tokens
                ));
            }
            params.check().map_err(|e| format!("{at}: {e}"))?;
            RewardFn::LlmJudge(params)
        }
    })
}

impl RewardSpec {
    /// The checked reward; errors name `at` (the config path) and suggest the closest name.
    pub fn resolve(&self, at: &str) -> Result<Reward, String> {
        match self {
            RewardSpec::Name(name) => {
                let term = RewardTermConfig {
                    kind: name.clone(),
                    ..Default::default()
                };
                resolve_term(&term, at).map(Reward::One)
            }
            RewardSpec::Term(t) => {
                if t.weight.is_some() {
                    return Err(format!(
                        "{at}: 'weight' belongs to the terms of a 'combine' list"
                    ));
                }
                resolve_term(t, at).map(Reward::One)
            }
            RewardSpec::Combine(terms) => {
                if terms.is_empty() {
                    return Err(format!("{at}.combine must list at least one reward"));
                }
                let mut out = vec![];
                for (i, t) in terms.iter().enumerate() {
                    let here = format!("{at}.combine[{i}]");
                    let weight = t.weight.unwrap_or(1.0);
                    if !weight.is_finite() || weight < 0.0 {
                        return Err(format!(
                            "{here}.weight must be a finite number >= 0, got {weight}"
                        ));
                    }
                    out.push((resolve_term(t, &here)?, weight));
                }
                Ok(Reward::Weighted(out))
            }
        }
    }
}

impl Serialize for RewardSpec {
    /// As written: a bare name stays a bare name (so a config's hash does not change with this
    /// type).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RewardSpec::Name(name) => s.serialize_str(name),
            // Same fields in the same order as the map form, each skipped when unset.
            RewardSpec::Term(t) => t.serialize(s),
            RewardSpec::Combine(terms) => RewardTermConfig {
                combine: Some(terms.clone()),
                ..Default::default()
            }
            .serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for RewardSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SpecVisitor;
        impl<'de> Visitor<'de> for SpecVisitor {
            type Value = RewardSpec;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                let names: Vec<&str> = RewardKind::ALL.iter().map(|k| k.as_str()).collect();
                write!(
                    f,
                    "a reward name ({}) or a map with 'kind' or 'combine'",
                    names.join(", ")
                )
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<RewardSpec, E> {
                Ok(RewardSpec::Name(v.to_string()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RewardSpec, A::Error> {
                let m = RewardTermConfig::deserialize(de::value::MapAccessDeserializer::new(map))?;
                // No parameter or weight beside a `combine` list.
                let params_unset = RewardTermConfig {
                    kind: String::new(),
                    combine: None,
                    ..m.clone()
                } == RewardTermConfig::default();
                let kind = (!m.kind.is_empty()).then_some(());
                match (kind, m.combine.clone()) {
                    (Some(()), None) => Ok(RewardSpec::Term(Box::new(m))),
                    (None, Some(terms)) if params_unset => Ok(RewardSpec::Combine(terms)),
                    (None, Some(_)) => Err(de::Error::custom(
                        "parameters and 'weight' belong to a term of 'combine', not beside it",
                    )),
                    (Some(_), Some(_)) => Err(de::Error::custom(
                        "set either 'kind' (one reward) or 'combine' (several), not both",
                    )),
                    (None, None) => Err(de::Error::custom(
                        "a reward map needs 'kind' (one reward) or 'combine' (several)",
                    )),
                }
            }
        }
        d.deserialize_any(SpecVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> RewardSpec {
        serde_json::from_str(json).expect("a spec")
    }

    #[test]
    fn names_maps_and_combinations_parse_and_serialize_as_written() {
        for text in [
            r#""math_rule""#,
            r#"{"kind":"exact_match","ignore_case":true}"#,
            r#"{"combine":[{"kind":"math_rule","weight":0.8},{"kind":"exact_match"}]}"#,
        ] {
            assert_eq!(serde_json::to_string(&spec(text)).unwrap_or_default(), text);
        }
        let err = serde_json::from_str::<RewardSpec>(r#"{"kind":"math_rule","weigth":1}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `weigth`"), "{err}");
        let err = serde_json::from_str::<RewardSpec>(r#"{"kind":"a","combine":[]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not both"), "{err}");
    }

    #[test]
    fn unknown_names_and_misplaced_parameters_are_errors_naming_where() {
        let at = "data.domains[0] ('add').reward";
        assert_eq!(
            spec(r#""math_rul""#).resolve(at).unwrap_err(),
            "data.domains[0] ('add').reward: unknown reward 'math_rul' (did you mean \
             'math_rule'?) (known: math_rule, math_verify, exact_match, code_sandbox, ifeval, regex_match, llm_judge)"
        );
        let e = spec(r#"{"combine":[{"kind":"math_rule"},{"kind":"exact"}]}"#)
            .resolve(at)
            .unwrap_err();
        assert!(e.starts_with("data.domains[0] ('add').reward.combine[1]: unknown reward 'exact' (did you mean 'exact_match'?)"), "{e}");
        let e = spec(r#"{"kind":"math_rule","ignore_case":true}"#)
            .resolve(at)
            .unwrap_err();
        assert!(
            e.contains("'ignore_case' is a parameter of exact_match"),
            "{e}"
        );
        assert!(spec(r#"{"combine":[]}"#).resolve(at).is_err());
        let e = spec(r#"{"combine":[{"kind":"math_rule","weight":-1}]}"#)
            .resolve(at)
            .unwrap_err();
        assert!(e.contains("combine[0].weight must be"), "{e}");
        let e = spec(r#"{"kind":"math_rule","weight":2}"#)
            .resolve(at)
            .unwrap_err();
        assert!(
            e.contains("'weight' belongs to the terms of a 'combine' list"),
            "{e}"
        );
        // Terms share the spec's map type: a term may not combine, and must name its kind.
        let e = spec(r#"{"combine":[{"combine":[{"kind":"math_rule"}]}]}"#)
            .resolve(at)
            .unwrap_err();
        assert!(
            e.ends_with(
                "reward.combine[0]: 'combine' belongs at the top of a reward, not inside a term"
            ),
            "{e}"
        );
        let e = spec(r#"{"combine":[{"weight":1}]}"#)
            .resolve(at)
            .unwrap_err();
        assert!(
            e.ends_with("reward.combine[0]: a reward term needs 'kind'"),
            "{e}"
        );
        let e = serde_json::from_str::<RewardSpec>(r#"{"ignore_case":true,"combine":[]}"#);
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("belong to a term of 'combine'")
        );
    }

    #[test]
    fn a_parameter_changes_the_score() {
        let strict = spec(r#""exact_match""#).resolve("r").unwrap();
        let loose = spec(r#"{"kind":"exact_match","ignore_case":true}"#)
            .resolve("r")
            .unwrap();
        assert_eq!(strict.score("p", "PARIS", "Paris").score, 0.0);
        assert_eq!(loose.score("p", "PARIS", "Paris").score, 1.0);
        // A single kind scores exactly as its rule does, with no components.
        let one = spec(r#""math_rule""#).resolve("r").unwrap();
        assert_eq!(
            one.score("p", "x = 12", "12"),
            math_rule::score("x = 12", "12")
        );
    }

    #[test]
    fn the_newer_kinds_check_and_use_their_parameters() {
        let e = spec(r#""regex_match""#).resolve("r").unwrap_err();
        assert!(e.contains("regex_match needs 'pattern'"), "{e}");
        let e = spec(r#"{"kind":"regex_match","pattern":"("}"#)
            .resolve("r")
            .unwrap_err();
        assert!(
            e.contains("r.pattern: '(' is not a regular expression"),
            "{e}"
        );
        let e = spec(r#"{"kind":"math_verify","mode":"loose"}"#)
            .resolve("r")
            .unwrap_err();
        assert!(e.contains("'mode' is a parameter of ifeval"), "{e}");
        let e = spec(r#"{"kind":"exact_match","scoring":"fraction"}"#)
            .resolve("r")
            .unwrap_err();
        assert!(
            e.contains("'scoring' is a parameter of code_sandbox and ifeval"),
            "{e}"
        );
        let e = spec(r#"{"kind":"code_sandbox","timeout_s":0}"#)
            .resolve("r")
            .unwrap_err();
        assert!(e.contains("timeout_s must be in (0, 600]"), "{e}");
        // `scoring: fraction` turns 1 instruction followed of 2 into 0.5 instead of 0.
        let truth = r#"{"instruction_id_list":["punctuation:no_comma","startend:quotation"],"kwargs":[{},{}]}"#;
        let all = spec(r#""ifeval""#).resolve("r").unwrap();
        let fraction = spec(r#"{"kind":"ifeval","scoring":"fraction"}"#)
            .resolve("r")
            .unwrap();
        assert_eq!(all.score("p", "no commas", truth).score, 0.0);
        assert_eq!(fraction.score("p", "no commas", truth).score, 0.5);
        // `pattern` decides the format term.
        let boxed = spec(r#"{"kind":"regex_match","pattern":"boxed"}"#)
            .resolve("r")
            .unwrap();
        assert_eq!(boxed.score("p", "\\boxed{1}", "").score, 1.0);
        assert_eq!(boxed.score("p", "1", "").score, 0.0);
    }

    #[test]
    fn a_combination_is_the_weighted_sum_with_each_term_as_a_component() {
        let r = spec(
            r#"{"combine":[{"kind":"math_rule","weight":0.75},{"kind":"exact_match","weight":0.25},
                {"kind":"exact_match","ignore_case":true,"weight":0.5}]}"#,
        )
        .resolve("r")
        .unwrap();
        // "12.0" vs "12": math_rule right (1), exact_match wrong (0), case-free exact wrong (0):
        // 0.75·1 + 0.25·0 + 0.5·0 = 0.75, and not every term is correct.
        let out = r.score("p", "12.0", "12");
        assert_eq!(out.score, 0.75);
        assert!(!out.correct && out.format_ok);
        assert_eq!(
            out.components,
            [
                ("math_rule".to_string(), 1.0),
                ("exact_match".to_string(), 0.0),
                ("exact_match#2".to_string(), 0.0)
            ]
        );
        // "12": every term right: 0.75 + 0.25 + 0.5 = 1.5.
        let out = r.score("p", "12", "12");
        assert_eq!((out.score, out.correct), (1.5, true));
    }
}
