//! The WebShop score of a purchase (Yao et al., 2022, and `get_reward` of its code): the share of
//! the goal's attributes, options and price limit that the bought product meets, times a type
//! factor that is 1 for the right kind of product and falls to 0 for an unrelated one:
//!
//! `score = (attributes met + options met + [price <= limit]) / (|attributes| + |options| + 1) × r_type`
//!
//! `r_type` is 1, or 0.5 when neither the product type (WebShop's query), nor two levels of the
//! category path, nor more than 0.2 of the goal title's nouns match; 0.1 below 0.1 of the nouns,
//! 0 with none. Our titles are generated as `brand attributes… type`, so their nouns are the
//! brand and the type's words (WebShop finds them with a part-of-speech tagger). Attributes and
//! options match exactly (WebShop: a fuzzy token-set ratio above 85, which exact equality of our
//! generated vocabulary also meets), or by appearing in the product's title as whole words (so
//! the brand `evergreen` does not hold the colour `green`). Options count the goal's options that
//! a selected value meets, each at most once (WebShop counts the purchased options, which with its
//! catalogue's one value per option group comes to the same, but could exceed the goal's count
//! with another catalogue).

use std::collections::{BTreeMap, BTreeSet};

use super::catalogue::Product;

/// What an instruction asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Goal {
    pub instruction: String,
    /// The product the goal was drawn from (it meets the goal fully).
    pub target_id: String,
    pub product_type: String,
    pub category: Vec<String>,
    pub title: String,
    pub attributes: Vec<String>,
    /// Option group → the value wanted.
    pub options: BTreeMap<String, String>,
    pub price_upper: f64,
}

impl Goal {
    /// The goal of buying `target` with these attributes, options and price limit, and its
    /// instruction in WebShop's words.
    pub fn new(
        target: &Product,
        attributes: Vec<String>,
        options: BTreeMap<String, String>,
        price_upper: f64,
    ) -> Goal {
        let mut instruction = format!("i am looking for a {}", target.product_type);
        if !attributes.is_empty() {
            instruction.push_str(&format!(" that is {}", attributes.join(" and ")));
        }
        if !options.is_empty() {
            let opts: Vec<String> = options.iter().map(|(g, v)| format!("{g}: {v}")).collect();
            instruction.push_str(&format!(", with {}", opts.join(", and ")));
        }
        instruction.push_str(&format!(", and price lower than {price_upper:.2} dollars"));
        Goal {
            instruction,
            target_id: target.id.clone(),
            product_type: target.product_type.clone(),
            category: target.category.clone(),
            title: target.title.clone(),
            attributes,
            options,
            price_upper,
        }
    }
}

/// The brand (a title's first word) and the product type's words.
fn nouns(title: &str, product_type: &str) -> BTreeSet<String> {
    title
        .split_whitespace()
        .take(1)
        .chain(product_type.split_whitespace())
        .map(str::to_lowercase)
        .collect()
}

/// The type factor `r_type`.
fn type_factor(goal: &Goal, bought: &Product) -> f64 {
    let query_match = bought.product_type == goal.product_type;
    let bought_cats: BTreeSet<&String> = bought.category.iter().collect();
    let category_match = goal
        .category
        .iter()
        .filter(|c| bought_cats.contains(c))
        .count()
        >= 2;
    let want = nouns(&goal.title, &goal.product_type);
    let have = nouns(&bought.title, &bought.product_type);
    let title_score = match want.len() {
        0 => 0.2,
        n => want.intersection(&have).count() as f64 / n as f64,
    };
    let mut r_type = 1.0;
    if !(query_match || category_match || title_score > 0.2) {
        r_type = 0.5;
    }
    if title_score < 0.1 {
        r_type = 0.1;
    }
    if title_score == 0.0 {
        r_type = 0.0;
    }
    r_type
}

/// Whether `phrase` appears in `text` as whole words.
fn has_phrase(text: &str, phrase: &str) -> bool {
    let words = |t: &str| {
        t.split_whitespace()
            .map(str::to_lowercase)
            .collect::<Vec<_>>()
    };
    let (text, phrase) = (words(text), words(phrase));
    !phrase.is_empty() && text.windows(phrase.len()).any(|w| w == phrase.as_slice())
}

/// The score of buying `bought` with the options `selected` (group → value) for `goal`.
pub fn score(goal: &Goal, bought: &Product, selected: &BTreeMap<String, String>) -> f64 {
    let attributes = goal
        .attributes
        .iter()
        .filter(|a| bought.attributes.contains(a) || has_phrase(&bought.title, a))
        .count();
    let chosen: BTreeSet<&String> = selected.values().collect();
    let options = goal
        .options
        .values()
        .filter(|v| chosen.contains(v) || has_phrase(&bought.title, v))
        .count();
    let price = usize::from(bought.price <= goal.price_upper);
    let total = (attributes + options + price) as f64
        / (goal.attributes.len() + goal.options.len() + 1) as f64;
    total * type_factor(goal, bought)
}
