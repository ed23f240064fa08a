//! The 25 verifiable instructions of IFEval: each parsed from its id and kwargs (as the dataset
//! writes them) and checked on a response, with IFEval's own rules (see each variant).

use regex::{Regex, RegexBuilder};
use serde_json::{Map, Value};

use super::text::{
    count_sentences, count_words, py_islower, py_isupper, py_json, py_strip, word_tokens,
};

/// `"less than"` or `"at least"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    LessThan,
    AtLeast,
}

impl Relation {
    fn holds(self, n: usize, k: usize) -> bool {
        match self {
            Relation::LessThan => n < k,
            Relation::AtLeast => n >= k,
        }
    }
}

/// One instruction with its parameters.
#[derive(Debug, Clone)]
pub enum Instruction {
    /// Every keyword occurs, case-insensitively, as a substring.
    KeywordsExist(Vec<Regex>),
    /// The keyword's case-insensitive occurrences (substrings) relate to the frequency.
    KeywordFrequency(Regex, Relation, usize),
    /// No forbidden word occurs as a whole word (case-insensitive).
    ForbiddenWords(Vec<String>),
    /// The letter's count in the lowercased response relates to the frequency.
    LetterFrequency(char, Relation, usize),
    /// The detected language (langdetect, seed 0) is this ISO 639-1 code; text without any letter
    /// features counts as followed, as in IFEval.
    Language(String),
    Sentences(Relation, usize),
    /// Exactly this many paragraphs separated by `***`.
    Paragraphs(usize),
    Words(Relation, usize),
    /// Exactly `paragraphs` paragraphs separated by blank lines, the `nth` starting with `word`.
    NthParagraphFirstWord {
        paragraphs: usize,
        nth: usize,
        word: String,
    },
    /// At least this many `[placeholders]`.
    Placeholders(usize),
    /// A postscript starting with the marker (`P.S.`, `P.P.S`, or any text).
    Postscript(Regex),
    /// Exactly this many markdown bullets (`* ` or `-` at a line's start).
    BulletLists(usize),
    /// One of "My answer is yes.", "My answer is no.", "My answer is maybe.".
    ConstrainedResponse,
    /// At least this many `*highlighted*` or `**highlighted**` parts.
    Highlights(usize),
    /// At least this many sections started by the splitter and a number (`SECTION 1`).
    Sections(Regex, usize),
    /// The whole response (a ```json fence allowed) is JSON.
    Json,
    /// A `<<title>>`.
    Title,
    /// Two different responses separated by `******`.
    TwoResponses,
    /// Starts by repeating the request (case-insensitive).
    RepeatPrompt(String),
    /// Ends with the phrase (case-insensitive; surrounding quotes allowed).
    EndsWith(String),
    /// The number of all-capital words relates to the frequency.
    CapitalWords(Relation, usize),
    /// All capital letters, in English.
    EnglishCapital,
    /// All lowercase letters, in English.
    EnglishLowercase,
    NoComma,
    /// Wrapped in double quotes.
    Quotation,
}

/// Every instruction id, for errors and help.
pub const IDS: [&str; 25] = [
    "keywords:existence",
    "keywords:frequency",
    "keywords:forbidden_words",
    "keywords:letter_frequency",
    "language:response_language",
    "length_constraints:number_sentences",
    "length_constraints:number_paragraphs",
    "length_constraints:number_words",
    "length_constraints:nth_paragraph_first_word",
    "detectable_content:number_placeholders",
    "detectable_content:postscript",
    "detectable_format:number_bullet_lists",
    "detectable_format:constrained_response",
    "detectable_format:number_highlighted_sections",
    "detectable_format:multiple_sections",
    "detectable_format:json_format",
    "detectable_format:title",
    "combination:two_responses",
    "combination:repeat_prompt",
    "startend:end_checker",
    "change_case:capital_word_frequency",
    "change_case:english_capital",
    "change_case:english_lowercase",
    "punctuation:no_comma",
    "startend:quotation",
];

/// The kwargs of one instruction (`null` values are absent, as in the Hugging Face copy).
struct Kwargs<'a> {
    id: &'a str,
    map: &'a Map<String, Value>,
}

impl Kwargs<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn text(&self, key: &str) -> Result<String, String> {
        match self.get(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(format!(
                "{}: '{key}' must be a string, got {other}",
                self.id
            )),
            None => Err(format!("{}: needs '{key}'", self.id)),
        }
    }

    fn count(&self, key: &str) -> Result<usize, String> {
        match self.get(key).and_then(Value::as_u64) {
            Some(n) => usize::try_from(n).map_err(|e| format!("{}: '{key}': {e}", self.id)),
            None => Err(format!("{}: needs '{key}' as a whole number >= 0", self.id)),
        }
    }

    fn words(&self, key: &str) -> Result<Vec<String>, String> {
        match self.get(key) {
            Some(Value::Array(a)) => a
                .iter()
                .map(|w| w.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("{}: '{key}' must be a list of strings", self.id)),
            _ => Err(format!("{}: needs '{key}' (a list of strings)", self.id)),
        }
    }

    fn relation(&self, key: &str) -> Result<Relation, String> {
        match self.text(key)?.as_str() {
            "less than" => Ok(Relation::LessThan),
            "at least" => Ok(Relation::AtLeast),
            other => Err(format!(
                "{}: '{key}' must be \"less than\" or \"at least\", got \"{other}\"",
                self.id
            )),
        }
    }
}

/// A case-insensitive literal (IFEval passes keywords to `re` unescaped; the dataset's are plain
/// words, for which escaping them is the same, and arbitrary text stays a literal).
fn literal(text: &str) -> Result<Regex, String> {
    RegexBuilder::new(&regex::escape(text))
        .case_insensitive(true)
        .build()
        .map_err(|e| e.to_string())
}

impl Instruction {
    /// The instruction of `id` with `kwargs` (an object, as in IFEval's `kwargs` list).
    pub fn parse(id: &str, kwargs: &Value) -> Result<Instruction, String> {
        let empty = Map::new();
        let map = match kwargs {
            Value::Object(m) => m,
            Value::Null => &empty,
            other => return Err(format!("{id}: kwargs must be an object, got {other}")),
        };
        let k = Kwargs { id, map };
        Ok(match id {
            "keywords:existence" => Instruction::KeywordsExist(
                k.words("keywords")?
                    .iter()
                    .map(|w| literal(w))
                    .collect::<Result<_, _>>()?,
            ),
            "keywords:frequency" => Instruction::KeywordFrequency(
                literal(py_strip(&k.text("keyword")?))?,
                k.relation("relation")?,
                k.count("frequency")?,
            ),
            "keywords:forbidden_words" => Instruction::ForbiddenWords(k.words("forbidden_words")?),
            "keywords:letter_frequency" => {
                let letter = k.text("letter")?;
                let letter = py_strip(&letter).to_lowercase();
                let mut chars = letter.chars();
                let (Some(c), None) = (chars.next(), chars.next()) else {
                    return Err(format!(
                        "{id}: 'letter' must be one character, got \"{letter}\""
                    ));
                };
                Instruction::LetterFrequency(
                    c,
                    k.relation("let_relation")?,
                    k.count("let_frequency")?,
                )
            }
            "language:response_language" => Instruction::Language(k.text("language")?),
            "length_constraints:number_sentences" => {
                Instruction::Sentences(k.relation("relation")?, k.count("num_sentences")?)
            }
            "length_constraints:number_paragraphs" => {
                Instruction::Paragraphs(k.count("num_paragraphs")?)
            }
            "length_constraints:number_words" => {
                Instruction::Words(k.relation("relation")?, k.count("num_words")?)
            }
            "length_constraints:nth_paragraph_first_word" => Instruction::NthParagraphFirstWord {
                paragraphs: k.count("num_paragraphs")?,
                nth: k.count("nth_paragraph")?,
                word: k.text("first_word")?.to_lowercase(),
            },
            "detectable_content:number_placeholders" => {
                Instruction::Placeholders(k.count("num_placeholders")?)
            }
            "detectable_content:postscript" => {
                let marker = py_strip(&k.text("postscript_marker")?).to_string();
                let core = match marker.as_str() {
                    "P.P.S" => r"p\.\s?p\.\s?s".to_string(),
                    "P.S." => r"p\.\s?s\.".to_string(),
                    other => regex::escape(&other.to_lowercase()),
                };
                Instruction::Postscript(Regex::new(&core).map_err(|e| e.to_string())?)
            }
            "detectable_format:number_bullet_lists" => {
                Instruction::BulletLists(k.count("num_bullets")?)
            }
            "detectable_format:constrained_response" => Instruction::ConstrainedResponse,
            "detectable_format:number_highlighted_sections" => {
                Instruction::Highlights(k.count("num_highlights")?)
            }
            "detectable_format:multiple_sections" => {
                let splitter = py_strip(&k.text("section_spliter")?).to_string();
                let pattern = format!(r"\s?{}\s?\d+\s?", regex::escape(&splitter));
                Instruction::Sections(
                    Regex::new(&pattern).map_err(|e| e.to_string())?,
                    k.count("num_sections")?,
                )
            }
            "detectable_format:json_format" => Instruction::Json,
            "detectable_format:title" => Instruction::Title,
            "combination:two_responses" => Instruction::TwoResponses,
            "combination:repeat_prompt" => Instruction::RepeatPrompt(k.text("prompt_to_repeat")?),
            "startend:end_checker" => {
                Instruction::EndsWith(py_strip(&k.text("end_phrase")?).to_string())
            }
            "change_case:capital_word_frequency" => Instruction::CapitalWords(
                k.relation("capital_relation")?,
                k.count("capital_frequency")?,
            ),
            "change_case:english_capital" => Instruction::EnglishCapital,
            "change_case:english_lowercase" => Instruction::EnglishLowercase,
            "punctuation:no_comma" => Instruction::NoComma,
            "startend:quotation" => Instruction::Quotation,
            other => {
                return Err(format!(
                    "unknown instruction id '{other}'{} (known: {})",
                    crate::text::suggestion_suffix(other, IDS),
                    IDS.join(", ")
                ));
            }
        })
    }

    /// Whether `value` follows the instruction (IFEval's `check_following`).
    pub fn follows(&self, value: &str) -> bool {
        match self {
            Instruction::KeywordsExist(words) => words.iter().all(|w| w.is_match(value)),
            Instruction::KeywordFrequency(word, rel, k) => {
                rel.holds(word.find_iter(value).count(), *k)
            }
            Instruction::ForbiddenWords(words) => !words.iter().any(|w| whole_word_in(w, value)),
            Instruction::LetterFrequency(c, rel, k) => {
                rel.holds(value.to_lowercase().chars().filter(|x| x == c).count(), *k)
            }
            Instruction::Language(code) => detected_language_is(value, code),
            Instruction::Sentences(rel, k) => rel.holds(count_sentences(value), *k),
            Instruction::Paragraphs(k) => star_paragraphs(value) == Some(*k),
            Instruction::Words(rel, k) => rel.holds(count_words(value), *k),
            Instruction::NthParagraphFirstWord {
                paragraphs,
                nth,
                word,
            } => nth_paragraph_first_word(value, *paragraphs, *nth, word),
            Instruction::Placeholders(k) => placeholder_regex().find_iter(value).count() >= *k,
            Instruction::Postscript(core) => core.is_match(&value.to_lowercase()),
            Instruction::BulletLists(k) => {
                let (stars, dashes) = bullet_regexes();
                stars.find_iter(value).count() + dashes.find_iter(value).count() == *k
            }
            Instruction::ConstrainedResponse => {
                let v = py_strip(value);
                [
                    "My answer is yes.",
                    "My answer is no.",
                    "My answer is maybe.",
                ]
                .iter()
                .any(|a| v.contains(a))
            }
            Instruction::Highlights(k) => highlights(value) >= *k,
            Instruction::Sections(splitter, k) => splitter.find_iter(value).count() >= *k,
            Instruction::Json => {
                let v = py_strip(value);
                let v = ["```json", "```Json", "```JSON", "```"]
                    .iter()
                    .fold(v, |v, p| v.strip_prefix(p).unwrap_or(v));
                let v = v.strip_suffix("```").unwrap_or(v);
                py_json(py_strip(v))
            }
            Instruction::Title => title_regex().find_iter(value).any(|m| {
                let inner = m.as_str().trim_start_matches('<').trim_end_matches('>');
                !py_strip(inner).is_empty()
            }),
            Instruction::TwoResponses => two_responses(value),
            Instruction::RepeatPrompt(prompt) => py_strip(value)
                .to_lowercase()
                .starts_with(&py_strip(prompt).to_lowercase()),
            Instruction::EndsWith(phrase) => py_strip(value)
                .trim_matches('"')
                .to_lowercase()
                .ends_with(&phrase.to_lowercase()),
            Instruction::CapitalWords(rel, k) => {
                let n = word_tokens(value).iter().filter(|t| py_isupper(t)).count();
                rel.holds(n, *k)
            }
            Instruction::EnglishCapital => py_isupper(value) && detected_language_is(value, "en"),
            Instruction::EnglishLowercase => py_islower(value) && detected_language_is(value, "en"),
            Instruction::NoComma => !value.contains(','),
            Instruction::Quotation => {
                let v = py_strip(value);
                v.chars().count() > 1 && v.starts_with('"') && v.ends_with('"')
            }
        }
    }
}

mod rules;
use rules::{
    bullet_regexes, detected_language_is, highlights, nth_paragraph_first_word, placeholder_regex,
    star_paragraphs, title_regex, two_responses, whole_word_in,
};
